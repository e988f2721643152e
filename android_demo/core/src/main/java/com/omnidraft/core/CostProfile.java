package com.omnidraft.core;

import java.io.File;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;

/**
 * Measured per-call latencies and the cost model's arithmetic (omnidraft_deploy/speculative/cost.py):
 * targetMs[T - 1] is one target call feeding T tokens, drafterMs[T - 1] one drafter call, calls
 * wider than measured are extrapolated linearly from the last two widths. One step that sends n
 * proposals after c drafter calls costs
 *
 * <pre>step_ms(c, n) = c * drafter(1) + target(n + 1) + overhead_ms (+ lookup_ms for a lookup)</pre>
 *
 * and an accepted proposal saves what a token costs target-only, target(1). Read from the session
 * folder's cost_profile.json (CostProfile.to_json, written by `omnidraft profile BUNDLE`); a
 * malformed file is refused naming it, as Python does. Every operation is in double precision, in
 * Python's order, so the draft-length decisions it feeds are Python's.
 */
public final class CostProfile {
    public static final String FILE = "cost_profile.json";

    final double[] targetMs;
    final double[] drafterMs;
    final double lookupMs; // host cost of one lookup proposal
    final double overheadMs; // host cost of one speculative step
    final int context; // the KV length targetMs was measured at
    final int farContext; // and targetMsFar's (0: none)
    final double[] targetMsFar;

    public CostProfile(double[] targetMs, double[] drafterMs, double lookupMs, double overheadMs) {
        this(targetMs, drafterMs, lookupMs, overheadMs, 0, 0, new double[0]);
    }

    CostProfile(double[] targetMs, double[] drafterMs, double lookupMs, double overheadMs, int context,
                int farContext, double[] targetMsFar) {
        if (targetMs.length == 0) {
            throw new IllegalArgumentException("a cost profile needs the target's 1-token latency at least");
        }
        if (targetMsFar.length > 0 && (targetMsFar.length != targetMs.length || !(farContext > context
                && context >= 0))) {
            throw new IllegalArgumentException("target_ms_far needs one latency per width of target_ms ("
                    + targetMs.length + ") and far_context > context, got " + targetMsFar.length
                    + " widths, contexts " + context + " / " + farContext);
        }
        positive("target_ms", targetMs);
        positive("drafter_ms", drafterMs);
        positive("target_ms_far", targetMsFar);
        nonNegative("lookup_ms", lookupMs);
        nonNegative("overhead_ms", overheadMs);
        this.targetMs = targetMs.clone();
        this.drafterMs = drafterMs.clone();
        this.lookupMs = lookupMs;
        this.overheadMs = overheadMs;
        this.context = context;
        this.farContext = farContext;
        this.targetMsFar = targetMsFar.clone();
    }

    private static void positive(String name, double[] values) {
        for (double v : values) {
            if (!(v > 0)) { // rejects NaN too
                throw new IllegalArgumentException(name + " must be positive latencies, got "
                        + java.util.Arrays.toString(values));
            }
        }
    }

    private static void nonNegative(String name, double value) {
        if (!(value >= 0)) {
            throw new IllegalArgumentException(name + " must be >= 0, got " + value);
        }
    }

    /** Parse CostProfile.to_json; any malformed field raises FormatException naming source. */
    public static CostProfile fromJson(String text, String source) throws FormatException {
        try {
            return fromMap(ByteLevelBpe.asMap(MiniJson.parse(text), "the profile"), source);
        } catch (IllegalArgumentException e) {
            throw new FormatException(source, "not a cost profile (" + e.getMessage() + ")");
        }
    }

    /** A parsed profile object (fromJson's checks). */
    static CostProfile fromMap(Map<String, Object> raw, String source) throws FormatException {
        try {
            if (!raw.containsKey("target_ms")) {
                throw new IllegalArgumentException("'target_ms'"); // Python names the missing key so
            }
            for (String key : new String[] {"prefill_ms_per_token", "drafter_prefill_ms_per_token"}) {
                nonNegative(key, number(raw, key, 0)); // the decoder never reads them; Python checks them
            }
            return new CostProfile(doubles(raw.get("target_ms")), doubles(raw.get("drafter_ms")),
                    number(raw, "lookup_ms", 0), number(raw, "overhead_ms", 0), (int) number(raw, "context", 0),
                    (int) number(raw, "far_context", 0), doubles(raw.get("target_ms_far")));
        } catch (IllegalArgumentException | ClassCastException e) {
            throw new FormatException(source, "not a cost profile (" + e.getMessage() + ")");
        }
    }

    public static CostProfile load(File file) throws IOException {
        return fromJson(new String(Files2.readAll(file), StandardCharsets.UTF_8), file.getPath());
    }

    private static double number(Map<String, Object> raw, String key, double otherwise) {
        Object v = raw.get(key);
        return v == null ? otherwise : ((Number) v).doubleValue();
    }

    private static double[] doubles(Object list) {
        if (list == null) {
            return new double[0];
        }
        List<Object> l = ByteLevelBpe.asList(list, "a latency list");
        double[] out = new double[l.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = ((Number) l.get(i)).doubleValue();
        }
        return out;
    }

    /** ms of a target call feeding nTokens. */
    public double target(int nTokens) {
        return width(targetMs, nTokens);
    }

    /** ms of a drafter call feeding nTokens (0 without drafter latencies: lookup only). */
    public double drafter(int nTokens) {
        return drafterMs.length > 0 ? width(drafterMs, nTokens) : 0.0;
    }

    /** What one token costs target-only: the time an accepted proposal saves. */
    public double valueMs() {
        return targetMs[0];
    }

    private static double width(double[] ms, int n) {
        if (n < 1) {
            throw new IllegalArgumentException("a call feeds at least one token, got " + n);
        }
        if (n <= ms.length) {
            return ms[n - 1];
        }
        if (ms.length == 1) {
            return ms[0] * n;
        }
        double slope = Math.max(0.0, ms[ms.length - 1] - ms[ms.length - 2]);
        return ms[ms.length - 1] + slope * (n - ms.length);
    }

    /** Cost of one step: drafter calls, one target call over nProposed + 1 tokens, host. */
    public double stepMs(int drafterCalls, int nProposed, boolean lookup) {
        if (nProposed == 0 && drafterCalls == 0 && !lookup) {
            return target(1); // a plain target step
        }
        double host = overheadMs + (lookup ? lookupMs : 0.0);
        return drafterCalls * drafter(1) + target(nProposed + 1) + host;
    }

    /**
     * Extra cost of proposing one more token after nProposed: a drafter call (model drafts only)
     * plus the wider verification; the first proposal also pays the step's host overhead.
     */
    public double marginalMs(int nProposed, boolean model) {
        double widen = target(nProposed + 2) - target(nProposed + 1);
        double first = nProposed == 0 ? overheadMs : 0.0;
        return (model ? drafter(1) : 0.0) + widen + first;
    }

    /**
     * Whether drafting on from nProposed model drafts to some length in (nProposed, kMax] pays: the
     * extra drafts' expected tokens (each survives with the survival so far times rate) times value
     * exceed their drafter calls plus the wider verification (cost.extension_pays).
     */
    public boolean extensionPays(int nProposed, int kMax, double survive, double rate, double value) {
        double gain = 0.0;
        double cost = 0.0;
        for (int j = nProposed; j < kMax; j++) {
            survive *= rate;
            gain += survive * value;
            cost += marginalMs(j, true);
            if (gain > cost) {
                return true;
            }
        }
        return false;
    }

    /**
     * How many proposals to make: keep adding while the next one's expected gain
     * survive * acceptance^i * value exceeds its marginal cost (0 allowed; cost.best_length).
     */
    public int bestLength(double acceptance, int kMax, boolean model) {
        int k = 0;
        double survive = 1.0;
        while (k < kMax) {
            survive *= acceptance;
            if (survive * valueMs() <= marginalMs(k, model)) {
                break;
            }
            k++;
        }
        return k;
    }
}
