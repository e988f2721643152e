package com.omnidraft.core;

/**
 * Logits -> probabilities -> samples (omnidraft_deploy/speculative/sampling.py), pure functions.
 * Temperature 0 is greedy: a one-hot row on the argmax (ties -> lowest id).
 */
public final class Sampling {
    private Sampling() {}

    /** Index of the largest value; ties go to the lowest index (torch.argmax on CPU). NaN wins. */
    public static int argmax(float[] row) {
        int best = 0;
        for (int i = 1; i < row.length; i++) {
            if (row[i] > row[best] || (Float.isNaN(row[i]) && !Float.isNaN(row[best]))) {
                best = i;
            }
        }
        return best;
    }

    /**
     * softmax(logits / temperature) as float32; temperature <= 0: one-hot argmax. In the order of
     * sampling.logits_to_probs and torch's CPU softmax, each step rounded to float32 as there: shift
     * by the max, divide by the temperature, exp, sum, multiply by the sum's reciprocal. A dominant
     * token's probability then saturates to 1.0 where torch's does (its sum rounds to 1.0f), which
     * decides whether a one-hot (lookup) proposal is accepted without a uniform draw (p >= q = 1).
     */
    public static float[] logitsToProbs(float[] logits, double temperature) {
        float[] out = new float[logits.length];
        if (temperature <= 0) {
            out[argmax(logits)] = 1f;
            return out;
        }
        float max = Float.NEGATIVE_INFINITY;
        for (float v : logits) {
            max = Math.max(max, v);
        }
        float t = (float) temperature;
        double sum = 0;
        for (int i = 0; i < logits.length; i++) {
            float z = (logits[i] - max) / t;
            out[i] = z == Float.NEGATIVE_INFINITY ? 0f : (float) Math.exp(z);
            sum += out[i];
        }
        float inverse = 1f / (float) sum;
        for (int i = 0; i < logits.length; i++) {
            out[i] *= inverse;
        }
        return out;
    }

    /** Renormalise probs onto the mask of directly mapped drafter ids; all-zero rows stay zero. */
    public static float[] restrictToDirect(float[] probs, VocabMap map) {
        float[] kept = new float[probs.length];
        double total = 0;
        for (int i = 0; i < probs.length; i++) {
            if (i < map.draftVocabSize && map.isDirect(i)) {
                kept[i] = probs[i];
                total += probs[i];
            }
        }
        if (total > 0) {
            for (int i = 0; i < kept.length; i++) {
                kept[i] = (float) (kept[i] / total);
            }
        }
        return kept;
    }

    /** Whether sample can draw from probs: a finite, positive total (sampling.has_mass). */
    public static boolean hasMass(float[] probs) {
        double total = 0;
        for (float p : probs) {
            total += p;
        }
        return total > 0 && !Double.isInfinite(total);
    }

    /** One id from probs (need not be normalised) by inverse CDF with one uniform draw u. */
    public static int sample(float[] probs, double u) {
        double[] cdf = new double[probs.length];
        double acc = 0;
        for (int i = 0; i < probs.length; i++) {
            acc += probs[i];
            cdf[i] = acc;
        }
        double target = u * acc;
        int lo = 0;
        int hi = probs.length; // first index with cdf > target (searchsorted right=True)
        while (lo < hi) {
            int mid = (lo + hi) >>> 1;
            if (cdf[mid] <= target) {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        int idx = Math.min(lo, probs.length - 1);
        while (probs[idx] <= 0) { // u landed on the end of the last non-zero bucket (rounding)
            idx--;
        }
        return idx;
    }
}
