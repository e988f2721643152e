package com.omnidraft.core;

import java.util.HashMap;
import java.util.Map;

/**
 * Model-free proposals in the target vocabulary: suffix lookup over the text seen so far
 * (omnidraft_deploy/speculative/lookup.py; llama.cpp's lookup decoding, prompt lookup). Find the
 * latest earlier place where the last n committed ids occurred (longest n first, maxNgram down to
 * minNgram) and propose the ids that followed it. The text searched is the earlier prompts and
 * outputs (keepHistory), the prompt and the generated text. The buffer holds at most maxTokens ids;
 * when full, the oldest half is dropped and the index rebuilt. The index maps each n-gram to the
 * position just after its latest occurrence.
 */
public final class LookupProposer {
    /** Proposed ids and the matched n-gram length (0: no match). */
    public static final class Candidate {
        public final int[] ids;
        public final int ngram;

        Candidate(int[] ids, int ngram) {
            this.ids = ids;
            this.ngram = ngram;
        }
    }

    private static final Candidate NONE = new Candidate(new int[0], 0);

    private final int minNgram;
    private final int maxNgram;
    private final int maxTokens;
    private final boolean keepHistory;
    private IntList buf = new IntList();
    private final Map<NGramCache.Key, Integer> index = new HashMap<>();

    /** lookup.LookupConfig's defaults: unigram to 4-gram matches, 8192 ids, history kept. */
    public LookupProposer() {
        this(1, 4, 8192, true);
    }

    public LookupProposer(int minNgram, int maxNgram, int maxTokens, boolean keepHistory) {
        if (!(1 <= minNgram && minNgram <= maxNgram)) {
            throw new IllegalArgumentException("need 1 <= min_ngram <= max_ngram, got " + minNgram + ", " + maxNgram);
        }
        if (maxTokens < 4 * maxNgram) {
            throw new IllegalArgumentException("max_tokens " + maxTokens + " is too small for n-grams of " + maxNgram);
        }
        this.minNgram = minNgram;
        this.maxNgram = maxNgram;
        this.maxTokens = maxTokens;
        this.keepHistory = keepHistory;
    }

    public int size() {
        return buf.size();
    }

    /** Start a generation: keep (or drop) the history, then append the prompt. */
    public void reset(int[] promptIds) {
        if (!keepHistory) {
            buf = new IntList();
            index.clear();
        }
        extend(promptIds);
    }

    /** Append committed target ids, indexing each n-gram that now has a follower. */
    public void extend(int[] ids) {
        for (int t : ids) {
            if (buf.size() >= maxTokens) {
                shrink();
            }
            buf.add(t);
            indexEnd(buf.size() - 1);
        }
    }

    /** Index the n-grams ending just before position p (their follower is buf[p]). */
    private void indexEnd(int p) {
        for (int n = minNgram; n <= Math.min(maxNgram, p); n++) {
            index.put(new NGramCache.Key(buf.slice(p - n, p)), p);
        }
    }

    private void shrink() {
        buf = new IntList(buf.slice(buf.size() / 2, buf.size()));
        index.clear();
        for (int p = 1; p < buf.size(); p++) {
            indexEnd(p);
        }
    }

    /** Up to k ids continuing the buffer's suffix (they may run into the current text). */
    public Candidate propose(int k) {
        if (k < 1) {
            return NONE;
        }
        int len = buf.size();
        for (int n = Math.min(maxNgram, len); n >= minNgram; n--) {
            Integer pos = index.get(new NGramCache.Key(buf.slice(len - n, len)));
            if (pos != null && pos < len) {
                return new Candidate(buf.slice(pos, Math.min(len, pos + k)), n);
            }
        }
        return NONE;
    }
}
