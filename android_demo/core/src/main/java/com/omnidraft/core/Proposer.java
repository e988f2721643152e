package com.omnidraft.core;

/**
 * What the decoding loop drafts with (CrossVocabDrafter alone, or HybridProposer over it and a
 * lookup), called each step in this order: propose, then commit with the verification's outcome.
 */
public interface Proposer {
    /** Start a generation after promptTargetIds; resets calls(). */
    void reset(int[] promptTargetIds);

    /** This step's proposals (target ids); uniforms feed sampled drafts. */
    Proposal propose(Uniforms uniforms);

    /** The target accepted proposal.targetIds[:nAccepted], then produced nextId. */
    void commit(Proposal proposal, int nAccepted, int nextId);

    /** Drafter model calls since reset. */
    int calls();
}
