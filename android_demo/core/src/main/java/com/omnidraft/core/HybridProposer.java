package com.omnidraft.core;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * Per step: model drafts, lookup drafts or none, whichever the cost model favours
 * (omnidraft_deploy/speculative/hybrid.py). It compares the expected saving,
 * value * E[extra tokens] - extra cost, of
 *
 * <ul>
 *   <li>a lookup proposal (LookupProposer; acceptance: an EMA per matched n-gram length, learned on
 *       every step with a lookup candidate, whichever source drafted), cut to the length that pays;
 *   <li>model drafts (CrossVocabDrafter under CostAwareDraftLen, which stops token by token);
 *   <li>a plain target step (saving 0).
 * </ul>
 *
 * A generation's first step never drafts with the model (the drafter would first read the whole
 * prompt before the first text). A step without model drafts appends the committed ids to the
 * drafter's context, so its KV catches up on its next drafting call.
 */
public final class HybridProposer implements Proposer {
    /** What one step did (cost.StepRecord). */
    public static final class Step {
        public final String source; // "model" | "lookup" | "none"
        public final int drafterCalls;
        public final int proposed;
        public final int accepted;

        Step(String source, int drafterCalls, int proposed, int accepted) {
            this.source = source;
            this.drafterCalls = drafterCalls;
            this.proposed = proposed;
            this.accepted = accepted;
        }
    }

    private static final double EMA = 0.2; // of the lookup acceptance per matched length
    private static final double LOOKUP_PRIOR = 0.3;

    private final CrossVocabDrafter model; // may be null: lookup only
    private final CostAwareDraftLen policy; // the model's policy
    private final LookupProposer lookup; // may be null: model drafts only
    private final CostProfile profile;
    private final int kMax;
    private final Map<Integer, Double> lookupRate = new HashMap<>();
    public final List<Step> trace = new ArrayList<>(); // this generation's steps
    private String source = "none";
    private int match;
    private int[] candidate = new int[0]; // this step's lookup proposal, uncut (scored at commit)

    /** model's policy must be a CostAwareDraftLen; kMax bounds both kinds of proposals. */
    public HybridProposer(CrossVocabDrafter model, LookupProposer lookup, CostProfile profile, int kMax) {
        if (model == null && lookup == null) {
            throw new IllegalArgumentException("a hybrid proposer needs a drafter model, a lookup proposer or both");
        }
        if (model != null && !(model.policy() instanceof CostAwareDraftLen)) {
            throw new IllegalArgumentException("the hybrid proposer's drafter needs a CostAwareDraftLen policy");
        }
        this.model = model;
        this.policy = model == null ? null : (CostAwareDraftLen) model.policy();
        this.lookup = lookup;
        this.profile = profile;
        this.kMax = kMax;
    }

    /** The source of the last proposal: "model", "lookup" or "none". */
    public String source() {
        return source;
    }

    /** This step's lookup candidate, uncut (empty: no match). */
    int[] candidate() {
        return candidate.clone();
    }

    /** The n-gram length this step's lookup candidate matched (0: none). */
    int match() {
        return match;
    }

    /** The drafter's policy (null without a drafter). */
    CostAwareDraftLen policy() {
        return policy;
    }

    /** The lookup acceptance estimate for matches of ngram ids. */
    public double lookupRate(int ngram) {
        return lookupRate.getOrDefault(ngram, LOOKUP_PRIOR);
    }

    @Override
    public void reset(int[] promptTargetIds) {
        if (model != null) {
            model.reset(promptTargetIds);
        }
        if (lookup != null) {
            lookup.reset(promptTargetIds);
        }
        trace.clear();
    }

    @Override
    public int calls() {
        return model == null ? 0 : model.calls();
    }

    /** Expected time saved by a k-proposal step over a plain step (ms; may be negative). */
    private double saving(double acceptance, int k, boolean byModel) {
        if (k == 0) {
            return 0.0;
        }
        double sum = 0.0;
        for (int i = 1; i <= k; i++) {
            sum += Math.pow(acceptance, i);
        }
        double gain = profile.valueMs() * sum;
        double cost = profile.stepMs(byModel ? k : 0, k, !byModel);
        return gain - (cost - profile.target(1));
    }

    @Override
    public Proposal propose(Uniforms uniforms) {
        LookupProposer.Candidate cand = lookup == null ? null : lookup.propose(kMax);
        candidate = cand == null ? new int[0] : cand.ids;
        match = cand == null ? 0 : cand.ngram;
        double aLook = lookupRate(match);
        int kLook = profile.bestLength(aLook, candidate.length, false);
        double saveLook = saving(aLook, kLook, false);
        CostAwareDraftLen drafting = trace.isEmpty() ? null : policy; // first step: no model drafts
        double saveModel = 0.0;
        if (drafting != null) {
            double aMod = drafting.rate();
            saveModel = saving(aMod, profile.bestLength(aMod, kMax, true), true);
        }
        if (kLook > 0 && saveLook >= saveModel) {
            source = "lookup";
            modelIdle();
            return Proposal.lookup(java.util.Arrays.copyOf(candidate, kLook));
        }
        if (drafting != null) {
            drafting.enabled = true; // the policy itself may still choose k = 0 (a plain step)
            Proposal prop = model.propose(uniforms);
            source = prop.nDrafted > 0 ? "model" : "none";
            return prop;
        }
        source = "none";
        modelIdle();
        return Proposal.EMPTY;
    }

    /** The drafter's bookkeeping for a step it does not draft (no model call). */
    private void modelIdle() {
        if (policy != null) {
            policy.enabled = false;
            model.propose(null);
        }
    }

    /**
     * Update the acceptance EMA of this step's lookup candidate from the committed ids: candidate
     * id j would have been accepted iff ids 0..j all equal them; positions past newIds are unknown.
     */
    private void scoreLookup(int[] newIds) {
        double r = lookupRate(match);
        for (int j = 0; j < Math.min(candidate.length, newIds.length); j++) {
            boolean hit = candidate[j] == newIds[j];
            r += EMA * ((hit ? 1.0 : 0.0) - r);
            if (!hit) {
                break;
            }
        }
        lookupRate.put(match, r);
    }

    @Override
    public void commit(Proposal proposal, int nAccepted, int nextId) {
        int[] newIds = java.util.Arrays.copyOf(proposal.targetIds, nAccepted + 1);
        newIds[nAccepted] = nextId;
        trace.add(new Step(source, proposal.nDrafted, proposal.targetIds.length, nAccepted));
        if (lookup != null) {
            lookup.extend(newIds);
        }
        if (candidate.length > 0) {
            scoreLookup(newIds);
        }
        if (model == null) {
            return;
        }
        if (source.equals("model")) {
            model.commit(proposal, nAccepted, nextId);
            return;
        }
        for (int t : newIds) { // no drafts this step: append the committed ids to its context
            model.commit(Proposal.EMPTY, 0, t);
        }
    }
}
