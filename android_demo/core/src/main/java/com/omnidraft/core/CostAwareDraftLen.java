package com.omnidraft.core;

import java.util.ArrayList;
import java.util.List;

/**
 * Draft one more token only while P(draft survives so far) * a * value > its marginal cost
 * (draft_len.CostAwareDraftLen, with the AcceptancePredictorDraftLen head it extends).
 *
 * <ul>
 *   <li>P(survive so far): the product of an online logistic head's predictions over each drafted
 *       token's confidence features, trained by SGD on the verification (accepted -> 1, the first
 *       rejected -> 0, later ones unobserved).
 *   <li>a (rate): the running conditional acceptance of drafter tokens, an EMA.
 *   <li>value: what a committed token costs now, the EMA ratio of the modelled cost of steps to
 *       the tokens they committed (undrafted tokens at a plain step's cost), at most target-only's.
 *   <li>marginal cost: one drafter call plus the wider verification (CostProfile.marginalMs).
 * </ul>
 *
 * When even the first token does not pay, nextDraftLen is 0 (a plain step); after exploreEvery
 * skipped steps one full draft is a probe, and each probe doubles that interval up to exploreMax;
 * drafting that pays resets it, as does a new generation. enabled false forces 0 (the hybrid
 * proposer's lookup and plain steps). Arithmetic in double, in Python's order.
 */
public final class CostAwareDraftLen implements DraftLenPolicy {
    private static final double LR = 0.5; // the head's SGD step
    private static final double EMA = 0.05;
    private static final double PRIOR = 0.6; // the acceptance rate before any verification
    private static final int EXPLORE_EVERY = 16;
    private static final int EXPLORE_MAX = 256;

    CostProfile profile;
    public final int maxLen;
    public boolean enabled = true;
    private final double[] weights = {2.0, 2.0, -1.0};
    private final List<double[]> feats = new ArrayList<>();
    private double survive = 1.0;
    private double rate = PRIOR;
    private double costMs;
    private double tokens = 1.0;
    private int skipped;
    private int interval = EXPLORE_EVERY;

    public CostAwareDraftLen(CostProfile profile, int maxLen) {
        this.profile = profile;
        this.maxLen = maxLen;
        this.costMs = profile.valueMs();
    }

    /** The running conditional acceptance of drafter tokens. */
    public double rate() {
        return rate;
    }

    /** ms a committed token costs at the current drafting (at most target-only's). */
    public double value() {
        return Math.min(profile.valueMs(), costMs / tokens);
    }

    /** The acceptance head's weights (top-1, 1 - normalised entropy, bias). */
    public double[] weights() {
        return weights.clone();
    }

    private double predict(double[] f) {
        double dot = f[0] * weights[0] + f[1] * weights[1] + f[2] * weights[2];
        return 1.0 / (1.0 + Math.exp(-dot));
    }

    @Override
    public int nextDraftLen() {
        feats.clear();
        survive = 1.0;
        if (!enabled) {
            return 0;
        }
        if (profile.extensionPays(0, maxLen, 1.0, rate, value())) {
            skipped = 0;
            interval = EXPLORE_EVERY;
            return maxLen;
        }
        if (skipped >= interval) { // a probe; the next one waits twice as long
            skipped = 0;
            interval = Math.min(2 * interval, EXPLORE_MAX);
            return maxLen;
        }
        skipped++;
        return 0;
    }

    @Override
    public void newContext() {
        skipped = 0;
        interval = EXPLORE_EVERY;
    }

    @Override
    public boolean keepDrafting(int i, double[] features) {
        feats.add(features.clone());
        survive *= predict(features);
        return profile.extensionPays(i + 1, maxLen, survive, rate, value());
    }

    @Override
    public void update(int nDrafted, int nAccepted) {
        if (nDrafted <= 0) { // a token this drafter did not draft costs what a plain step costs
            costMs += EMA * (profile.target(1) - costMs);
            tokens += EMA * (1.0 - tokens);
            return;
        }
        int labelled = Math.min(Math.min(nAccepted + 1, nDrafted), feats.size());
        for (int j = 0; j < labelled; j++) {
            double[] f = feats.get(j);
            double step = LR * ((j < nAccepted ? 1.0 : 0.0) - predict(f));
            for (int w = 0; w < weights.length; w++) {
                weights[w] += step * f[w];
            }
        }
        double cost = profile.stepMs(nDrafted, nDrafted, false);
        costMs += EMA * (cost - costMs);
        tokens += EMA * (nAccepted + 1 - tokens);
        for (int j = 0; j < Math.min(nAccepted + 1, nDrafted); j++) {
            rate += EMA * ((j < nAccepted ? 1.0 : 0.0) - rate);
        }
    }
}
