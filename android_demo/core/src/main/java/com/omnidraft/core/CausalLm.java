package com.omnidraft.core;

/**
 * A decoder with a static KV cache addressed by position (omnidraft_deploy.protocols.CausalLM).
 * {@code forward(ids, startPos)} feeds ids at positions startPos .. startPos+T-1 and returns T
 * logits rows, row i scoring the token after input i. Slots >= startPos are overwritten, so rolling
 * back is calling again with a smaller startPos.
 *
 * <p>{@code forwardLast} is the last row alone (protocols.LastRowLM / last_logits): what the target
 * prefill (its result unread) and every drafter call read. A model whose graph can score the last
 * position alone overrides it (OrtModel: a graph input {@code logits_from}); verification reads
 * every row and calls {@code forward}.
 */
public interface CausalLm {
    float[][] forward(int[] ids, int startPos);

    /** The last row of {@code forward(ids, startPos)}, with the same cache writes (all of ids). */
    default float[] forwardLast(int[] ids, int startPos) {
        float[][] rows = forward(ids, startPos);
        return rows[rows.length - 1];
    }

    /** Logits row length (may exceed the tokenizer's vocabulary: padded rows). */
    int vocabSize();

    int maxSeqLen();
}
