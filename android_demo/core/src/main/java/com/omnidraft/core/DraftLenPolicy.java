package com.omnidraft.core;

/**
 * Draft-length policy (omnidraft_deploy/speculative/draft_len.py), called each step in this order:
 * nextDraftLen() (upper bound k), keepDrafting(i, probs) after each drafted token, then
 * update(nDrafted, nAccepted) in drafter tokens once the target has verified.
 */
public interface DraftLenPolicy {
    int nextDraftLen();

    boolean keepDrafting(int i, float[] draftProbs);

    void update(int nDrafted, int nAccepted);

    /** Always draftLen tokens. */
    final class Fixed implements DraftLenPolicy {
        private final int draftLen;

        public Fixed(int draftLen) {
            this.draftLen = draftLen;
        }

        @Override public int nextDraftLen() {
            return draftLen;
        }

        @Override public boolean keepDrafting(int i, float[] draftProbs) {
            return true;
        }

        @Override public void update(int nDrafted, int nAccepted) {
        }
    }

    /** transformers' rule: +2 after a fully accepted draft, -1 otherwise, within [lo, hi]. */
    final class Heuristic implements DraftLenPolicy {
        private final int lo;
        private final int hi;
        private int draftLen;

        public Heuristic(int draftLen) {
            this(draftLen, 1, 16);
        }

        public Heuristic(int draftLen, int lo, int hi) {
            this.draftLen = draftLen;
            this.lo = lo;
            this.hi = hi;
        }

        @Override public int nextDraftLen() {
            return draftLen;
        }

        @Override public boolean keepDrafting(int i, float[] draftProbs) {
            return true;
        }

        @Override public void update(int nDrafted, int nAccepted) {
            int step = nAccepted >= nDrafted ? 2 : -1;
            draftLen = Math.max(lo, Math.min(hi, draftLen + step));
        }
    }

    /** "fixed" or "heuristic" (the names of draft_len.make_policy). */
    static DraftLenPolicy byName(String name, int draftLen) {
        if (name.equals("fixed")) {
            return new Fixed(draftLen);
        }
        if (name.equals("heuristic")) {
            return new Heuristic(draftLen);
        }
        throw new IllegalArgumentException("unknown draft-length policy '" + name + "'; choose from [fixed, heuristic]");
    }
}
