package com.omnidraft.core;

/**
 * Target-vocabulary proposals of one step (speculative/drafter.py Proposal): the one object that
 * crosses from a proposer (the drafter's ids mapped, or a lookup in the target's own ids) to
 * verification.
 */
public final class Proposal {
    static final Proposal EMPTY = new Proposal(new int[0], new float[0], null, new int[0], new boolean[0], 0);

    public final int[] targetIds;
    public final float[] q; // proposal probability of each target id
    public final float[][] rows; // full proposal rows over target ids (sampling modes), else null: one-hot
    public final int[] spans; // drafter tokens behind each proposal
    public final boolean[] merged; // from the n-gram cache
    public final int nDrafted; // drafter tokens drafted this step (0: a lookup or plain step)

    Proposal(int[] targetIds, float[] q, float[][] rows, int[] spans, boolean[] merged, int nDrafted) {
        this.targetIds = targetIds;
        this.q = q;
        this.rows = rows;
        this.spans = spans;
        this.merged = merged;
        this.nDrafted = nDrafted;
    }

    /** Lookup ids: deterministic, so their proposal law is one-hot (q = 1): exact mode stays exact. */
    static Proposal lookup(int[] ids) {
        float[] q = new float[ids.length];
        int[] spans = new int[ids.length];
        java.util.Arrays.fill(q, 1f);
        java.util.Arrays.fill(spans, 1);
        return new Proposal(ids, q, null, spans, new boolean[ids.length], 0);
    }
}
