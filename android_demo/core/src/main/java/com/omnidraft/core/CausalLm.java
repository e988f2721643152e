package com.omnidraft.core;

/**
 * A decoder with a static KV cache addressed by position (omnidraft_deploy.protocols.CausalLM).
 * {@code forward(ids, startPos)} feeds ids at positions startPos .. startPos+T-1 and returns T
 * logits rows, row i scoring the token after input i. Slots >= startPos are overwritten, so rolling
 * back is calling again with a smaller startPos. The drafter's caller reads only the last row.
 */
public interface CausalLm {
    float[][] forward(int[] ids, int startPos);

    /** Logits row length (may exceed the tokenizer's vocabulary: padded rows). */
    int vocabSize();

    int maxSeqLen();
}
