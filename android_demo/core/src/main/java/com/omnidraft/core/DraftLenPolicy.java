package com.omnidraft.core;

/**
 * Draft-length policy (omnidraft_deploy/speculative/draft_len.py), called each step in this order:
 * nextDraftLen() (upper bound k), keepDrafting(i, features) after each drafted token (features:
 * confidenceFeatures of the law it was drawn from), then update(nDrafted, nAccepted) in drafter
 * tokens once the target has verified. newContext() starts each generation.
 */
public interface DraftLenPolicy {
    int nextDraftLen();

    boolean keepDrafting(int i, double[] features);

    void update(int nDrafted, int nAccepted);

    /** A new generation (CrossVocabDrafter.reset); fixed and +2/-1 carry their state over. */
    default void newContext() {
    }

    /**
     * (V,) logits -> the 3 features of their temperature-1 softmax p (draft_len.confidence_features):
     * top-1 probability, 1 - H(p) / log V, and a bias 1. With z = logits - max (float32, floored at
     * -1e30 so that -inf masks contribute 0) and s = sum(exp z): top1 = 1 / s and
     * H = log s - sum(exp(z) z) / s.
     */
    static double[] confidenceFeatures(float[] logits) {
        float max = Float.NEGATIVE_INFINITY;
        for (float v : logits) {
            max = Math.max(max, v);
        }
        double s = 0.0;
        double dot = 0.0;
        for (float v : logits) {
            float z = Math.max(v - max, -1e30f);
            float e = (float) Math.exp(z);
            s += e;
            dot += (double) e * z;
        }
        double entropy = Math.log(s) - dot / s;
        return new double[] {1.0 / s, 1.0 - entropy / Math.log(Math.max(logits.length, 2)), 1.0};
    }

    /** Always draftLen tokens. */
    final class Fixed implements DraftLenPolicy {
        private final int draftLen;

        public Fixed(int draftLen) {
            this.draftLen = draftLen;
        }

        @Override public int nextDraftLen() {
            return draftLen;
        }

        @Override public boolean keepDrafting(int i, double[] features) {
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

        @Override public boolean keepDrafting(int i, double[] features) {
            return true;
        }

        @Override public void update(int nDrafted, int nAccepted) {
            int step = nAccepted >= nDrafted ? 2 : -1;
            draftLen = Math.max(lo, Math.min(hi, draftLen + step));
        }
    }

    /**
     * By the names of draft_len.make_policy: "fixed", "heuristic", or "cost" (needs a measured
     * profile, drafts up to 2 * draftLen: the runtime's cap, runtime/run.py bundle_decoder).
     */
    static DraftLenPolicy byName(String name, int draftLen, CostProfile profile) {
        if (name.equals("fixed")) {
            return new Fixed(draftLen);
        }
        if (name.equals("heuristic")) {
            return new Heuristic(draftLen);
        }
        if (name.equals("cost")) {
            if (profile == null) {
                throw new IllegalArgumentException("the cost policy needs a cost profile (omnidraft profile BUNDLE)");
            }
            return new CostAwareDraftLen(profile, 2 * draftLen);
        }
        throw new IllegalArgumentException("unknown draft-length policy '" + name
                + "'; choose from [cost, fixed, heuristic]");
    }
}
