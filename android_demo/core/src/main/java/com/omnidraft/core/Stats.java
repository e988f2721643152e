package com.omnidraft.core;

import java.util.ArrayList;
import java.util.List;

/** What generation did (speculative/stats.py DecodeStats), accumulated across calls. */
public final class Stats {
    public int generated;
    public int targetCalls;
    public int drafterCalls;
    public int proposed;
    public int accepted;
    public int mergedProposed;
    public int mergedAccepted;
    public long wallNanos;
    public int promptReused; // leading prompt ids found in the target's cache (not prefilled)
    public final List<Integer> acceptCounts = new ArrayList<>();
    public final List<Integer> draftLenTrace = new ArrayList<>();

    void record(boolean[] merged, int nProposed, int nAccepted, int nDrafted) {
        proposed += nProposed;
        accepted += nAccepted;
        for (int i = 0; i < nProposed; i++) {
            if (merged[i]) {
                mergedProposed++;
                if (i < nAccepted) {
                    mergedAccepted++;
                }
            }
        }
        acceptCounts.add(nAccepted);
        draftLenTrace.add(nDrafted);
    }

    public double acceptanceRate() {
        return proposed == 0 ? 0 : (double) accepted / proposed;
    }

    /** Tokens per target call: how many tokens each expensive call produced. */
    public double tokensPerTargetCall() {
        return targetCalls == 0 ? 0 : (double) generated / targetCalls;
    }

    public double tokensPerSecond() {
        return wallNanos == 0 ? 0 : generated / (wallNanos / 1e9);
    }

    public String summary() {
        return String.format(java.util.Locale.ROOT, "%d tokens, %.1f tok/s, acceptance %.2f, %.2f tokens/target call",
                generated, tokensPerSecond(), acceptanceRate(), tokensPerTargetCall());
    }
}
