package com.omnidraft.core;

/**
 * The speculative decoding loop (speculative/decoder.py): draft -> map -> verify -> commit. It
 * handles target-vocabulary ids only; the drafter's vocabulary lives behind CrossVocabDrafter and
 * VocabMap. Target KV invariant: after every step the target cache holds committed[:-1]; the next
 * call feeds [committed[-1], proposals...] at position committed.size() - 1 and reads the rows of
 * those inputs only (forwardTail). The first step is the prompt's prefill: it feeds [prompt...,
 * proposals...] at 0 and reads the same rows, so verifying the first proposals costs a few prefill
 * rows, not a target call of its own.
 */
public final class SpeculativeDecoder {
    /** Frozen decoding configuration (DecodeConfig). */
    public static final class Config {
        public final boolean exact; // false: greedy
        public final double temperature; // 0 for greedy, > 0 for exact
        public final int maxNewTokens;
        public final int[] eosIds;
        public final int vocabLimit; // logits at ids >= this are ignored (padded rows); <= 0: none

        public Config(boolean exact, double temperature, int maxNewTokens, int[] eosIds, int vocabLimit) {
            if (exact != (temperature > 0)) {
                throw new IllegalArgumentException("mode " + (exact ? "exact" : "greedy") + " needs temperature "
                        + (exact ? "> 0" : "== 0") + ", got " + temperature);
            }
            if (maxNewTokens < 1) {
                throw new IllegalArgumentException("max_new_tokens must be >= 1, got " + maxNewTokens);
            }
            this.exact = exact;
            this.temperature = temperature;
            this.maxNewTokens = maxNewTokens;
            this.eosIds = eosIds.clone();
            this.vocabLimit = vocabLimit;
        }
    }

    /** Sees the ids each verification step hands to the caller (for streaming). */
    public interface Listener {
        void onTokens(int[] newIds, Stats stats);
    }

    private final CausalLm target;
    private final Proposer drafter;
    private final Config cfg;

    /** Drafts with drafterLm alone under policy (no cost profile: the runtime's +2/-1 decoder). */
    public SpeculativeDecoder(CausalLm target, CausalLm drafterLm, VocabMap map, DraftLenPolicy policy,
                              NGramCache cache, Config cfg, int drafterBos) {
        this(target, new CrossVocabDrafter(drafterLm, map, policy, cfg.exact, cfg.temperature, target.vocabSize(),
                cache, drafterBos), cfg);
    }

    public SpeculativeDecoder(CausalLm target, Proposer proposer, Config cfg) {
        this.target = target;
        this.cfg = cfg;
        this.drafter = proposer;
    }

    /**
     * What `omnidraft run` decodes with when the session folder holds a measured cost profile
     * (runtime/run.py bundle_decoder): cost-aware drafting up to 2 * draftLen tokens, lookup
     * proposals (LookupProposer defaults) beside it, chosen per step by HybridProposer.
     */
    public static SpeculativeDecoder costAware(CausalLm target, CausalLm drafterLm, VocabMap map, CostProfile profile,
                                               int draftLen, NGramCache cache, Config cfg) {
        CostAwareDraftLen policy = new CostAwareDraftLen(profile, 2 * draftLen);
        CrossVocabDrafter model = new CrossVocabDrafter(drafterLm, map, policy, cfg.exact, cfg.temperature,
                target.vocabSize(), cache, map.drafterBos());
        return new SpeculativeDecoder(target, new HybridProposer(model, new LookupProposer(), profile, policy.maxLen),
                cfg);
    }

    public Proposer proposer() {
        return drafter;
    }

    /** Up to maxNewTokens target ids after promptIds (cut after the first EOS, which is kept). */
    public int[] generate(int[] promptIds, Uniforms uniforms, Stats stats, Listener listener) {
        if (promptIds.length == 0) {
            throw new IllegalArgumentException("prompt_ids must hold at least one token");
        }
        int cap = target.maxSeqLen();
        if (promptIds.length > cap) {
            throw new IllegalArgumentException("a prompt of " + promptIds.length + " tokens does not fit the"
                    + " target's capacity of " + cap + " tokens (max_seq_len); shorten it or export with a"
                    + " larger --max-seq-len");
        }
        long t0 = System.nanoTime();
        drafter.reset(promptIds);
        IntList committed = new IntList(promptIds);
        IntList out = new IntList();
        // committed[:fed] are in the target's cache: the first step is the prompt's prefill, from where
        // the cache stops holding this prompt (CachedTokens)
        int fed = CachedTokens.reusable(target, promptIds);
        stats.promptReused = fed;
        while (true) {
            Proposal prop = drafter.propose(uniforms);
            int room = cap - committed.size(); // the feed may reach position cap - 1, as target-only
            int nProp = Math.max(0, Math.min(prop.targetIds.length, room));
            int[] head = committed.slice(fed, committed.size());
            int[] feed = java.util.Arrays.copyOf(head, head.length + nProp);
            System.arraycopy(prop.targetIds, 0, feed, head.length, nProp);
            // only the rows verification reads (the prefill's: none)
            float[][] logits = limit(target.forwardTail(feed, fed, nProp + 1), cfg.vocabLimit);
            stats.targetCalls++;
            int[] proposals = java.util.Arrays.copyOf(prop.targetIds, nProp);
            int[] verdict = verify(proposals, prop, logits, uniforms);
            int nAcc = verdict[0];
            int[] newIds = java.util.Arrays.copyOf(proposals, nAcc + 1);
            newIds[nAcc] = verdict[1];
            int before = out.size();
            boolean done = finish(out, newIds);
            int[] kept = out.slice(before, out.size());
            drafter.commit(prop, nAcc, verdict[1]);
            stats.record(prop.merged, nProp, nAcc, prop.nDrafted);
            if (listener != null && kept.length > 0) {
                listener.onTokens(kept, stats);
            }
            committed.addAll(newIds);
            fed = committed.size() - 1; // the next id is fed with the next step's proposals
            if (done || committed.size() > cap) {
                break;
            }
        }
        stats.generated += out.size();
        stats.drafterCalls += drafter.calls();
        stats.wallNanos += System.nanoTime() - t0;
        return out.toArray();
    }

    private int[] verify(int[] proposals, Proposal prop, float[][] logits, Uniforms uniforms) {
        if (!cfg.exact) {
            return Verify.greedy(proposals, logits);
        }
        float[][] probs = new float[logits.length][];
        for (int i = 0; i < logits.length; i++) {
            probs[i] = Sampling.logitsToProbs(logits[i], cfg.temperature);
        }
        float[] q = java.util.Arrays.copyOf(prop.q, proposals.length);
        float[][] rows = prop.rows == null ? null : java.util.Arrays.copyOf(prop.rows, proposals.length);
        return Verify.rejection(proposals, q, rows, probs, uniforms);
    }

    /**
     * Appends newIds to out up to the first EOS (kept) or maxNewTokens, whichever comes first (an
     * EOS past the budget is cut like any token, as decoder._finish does); true when done.
     */
    private boolean finish(IntList out, int[] newIds) {
        for (int t : newIds) {
            if (out.size() >= cfg.maxNewTokens) {
                break;
            }
            out.add(t);
            for (int e : cfg.eosIds) {
                if (t == e) {
                    return true;
                }
            }
        }
        out.truncate(cfg.maxNewTokens);
        return out.size() >= cfg.maxNewTokens;
    }

    /**
     * Refuses NaN / +inf logits and rows that are all -inf (a broken graph would otherwise decode
     * as token 0 in every path), then masks ids >= limit (padded vocabulary rows) to -inf.
     */
    static float[][] limit(float[][] logits, int limit) {
        for (int r = 0; r < logits.length; r++) {
            boolean allNegInf = true;
            for (float v : logits[r]) {
                if (Float.isNaN(v) || v == Float.POSITIVE_INFINITY) {
                    throw new ArithmeticException("the target returned non-finite logits (NaN/inf) in row " + r
                            + " of this call: an overflow in the model or a broken graph; refusing to decode");
                }
                allNegInf &= v == Float.NEGATIVE_INFINITY;
            }
            if (allNegInf) {
                throw new ArithmeticException("the target returned a row of -inf logits (row " + r + ")");
            }
        }
        if (limit <= 0 || logits.length == 0 || limit >= logits[0].length) {
            return logits;
        }
        float[][] out = new float[logits.length][];
        for (int r = 0; r < logits.length; r++) {
            out[r] = logits[r].clone();
            java.util.Arrays.fill(out[r], limit, out[r].length, Float.NEGATIVE_INFINITY);
        }
        return out;
    }
}
