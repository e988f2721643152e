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

    /** softmax(logits / temperature) as float32; temperature <= 0: one-hot argmax. */
    public static float[] logitsToProbs(float[] logits, double temperature) {
        float[] out = new float[logits.length];
        if (temperature <= 0) {
            out[argmax(logits)] = 1f;
            return out;
        }
        float max = Float.NEGATIVE_INFINITY;
        float[] scaled = new float[logits.length];
        for (int i = 0; i < logits.length; i++) {
            scaled[i] = (float) (logits[i] / temperature);
            max = Math.max(max, scaled[i]);
        }
        double sum = 0;
        for (int i = 0; i < logits.length; i++) {
            double e = scaled[i] == Float.NEGATIVE_INFINITY ? 0.0 : Math.exp(scaled[i] - max);
            out[i] = (float) e;
            sum += e;
        }
        for (int i = 0; i < logits.length; i++) {
            out[i] = (float) (out[i] / sum);
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
