package com.omnidraft.core;

/**
 * A decoder with a static KV cache addressed by position (omnidraft_deploy.protocols.CausalLM).
 * {@code forward(ids, startPos)} feeds ids at positions startPos .. startPos+T-1 and returns T
 * logits rows, row i scoring the token after input i. Slots >= startPos are overwritten, so rolling
 * back is calling again with a smaller startPos.
 *
 * <p>{@code forwardTail} is the last {@code rows} rows alone (protocols.TailRowsLM / tail_logits):
 * every drafter call reads one; every target call of the speculative decoder reads its
 * verification rows, the proposals' and the next token's (the first call is the prompt's prefill
 * with the first proposals, whose prompt rows are not read). A model whose graph can score the
 * tail alone overrides it (OrtModel: a graph input {@code logits_from} = T - rows).
 */
public interface CausalLm {
    float[][] forward(int[] ids, int startPos);

    /**
     * The last {@code rows} rows of {@code forward(ids, startPos)} (1 <= rows <= ids.length), with
     * the same cache writes (all of ids).
     */
    default float[][] forwardTail(int[] ids, int startPos, int rows) {
        if (rows < 1 || rows > ids.length) {
            throw new IllegalArgumentException("rows " + rows + " of a " + ids.length + "-token call: want 1.."
                    + ids.length);
        }
        float[][] all = forward(ids, startPos);
        return java.util.Arrays.copyOfRange(all, all.length - rows, all.length);
    }

    /** The ids this model's cache holds, position by position (CachedTokens), or null: none kept. */
    default CachedTokens cached() {
        return null;
    }

    /** Logits row length (may exceed the tokenizer's vocabulary: padded rows). */
    int vocabSize();

    int maxSeqLen();
}
