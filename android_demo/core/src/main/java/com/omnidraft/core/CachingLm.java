package com.omnidraft.core;

/**
 * Any CausalLm with a record of the ids its cache holds (CachedTokens), kept as it is called: what lets
 * the decoder skip the prefill of a prompt's cached start. Session wraps the app's graphs in it.
 */
public final class CachingLm implements CausalLm {
    private final CausalLm inner;
    private final CachedTokens cached = new CachedTokens();

    public CachingLm(CausalLm inner) {
        this.inner = inner;
    }

    @Override
    public float[][] forward(int[] ids, int startPos) {
        cached.keep(startPos); // a call that fails leaves its positions unknown
        float[][] out = inner.forward(ids, startPos);
        cached.fed(ids, startPos);
        return out;
    }

    @Override
    public float[][] forwardTail(int[] ids, int startPos, int rows) {
        cached.keep(startPos);
        float[][] out = inner.forwardTail(ids, startPos, rows);
        cached.fed(ids, startPos);
        return out;
    }

    @Override
    public CachedTokens cached() {
        return cached;
    }

    @Override
    public int vocabSize() {
        return inner.vocabSize();
    }

    @Override
    public int maxSeqLen() {
        return inner.maxSeqLen();
    }
}
