package com.omnidraft.core;

/**
 * Verification of target-vocabulary proposals (omnidraft_deploy/speculative/verify.py), returning
 * {n_accepted, next_id}. Greedy: accept while the proposal is the target's argmax. Rejection
 * sampling (Leviathan et al., 2023): accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); on
 * the first rejection sample from norm(max(0, p_i - q_i)); after n acceptances sample from p_n.
 */
public final class Verify {
    private Verify() {}

    /** targetLogits: n+1 rows. Deterministic, consumes no uniforms. */
    public static int[] greedy(int[] proposalIds, float[][] targetLogits) {
        for (int i = 0; i < proposalIds.length; i++) {
            int best = Sampling.argmax(targetLogits[i]);
            if (best != proposalIds[i]) {
                return new int[] {i, best};
            }
        }
        return new int[] {proposalIds.length, Sampling.argmax(targetLogits[proposalIds.length])};
    }

    /**
     * proposalQ: probability the proposer gave each proposal; proposalRows: full proposal
     * distributions over target ids (for the residual); targetProbs: n+1 rows.
     */
    public static int[] rejection(int[] proposalIds, float[] proposalQ, float[][] proposalRows,
                                  float[][] targetProbs, Uniforms uniforms) {
        for (int i = 0; i < proposalIds.length; i++) {
            int x = proposalIds[i];
            double p = targetProbs[i][x];
            double q = proposalQ[i];
            if (q <= 0.0) {
                throw new IllegalArgumentException("proposal " + i + " (id " + x + ") has proposal probability " + q);
            }
            if (p >= q || uniforms.next() < p / q) {
                continue;
            }
            float[] row;
            if (proposalRows != null) {
                row = proposalRows[i];
            } else {
                row = new float[targetProbs[i].length];
                row[x] = 1f;
            }
            return new int[] {i, Sampling.sample(residual(targetProbs[i], row), uniforms.next())};
        }
        int n = proposalIds.length;
        return new int[] {n, Sampling.sample(targetProbs[n], uniforms.next())};
    }

    /** norm(max(0, p - q)); falls back to p when p <= q everywhere. */
    public static float[] residual(float[] p, float[] q) {
        float[] diff = new float[p.length];
        double total = 0;
        for (int i = 0; i < p.length; i++) {
            float d = p[i] - (i < q.length ? q[i] : 0f);
            diff[i] = d > 0 ? d : 0f;
            total += diff[i];
        }
        if (total <= 0) {
            return p;
        }
        for (int i = 0; i < diff.length; i++) {
            diff[i] = (float) (diff[i] / total);
        }
        return diff;
    }
}
