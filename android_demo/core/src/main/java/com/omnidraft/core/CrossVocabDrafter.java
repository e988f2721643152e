package com.omnidraft.core;

import java.util.ArrayList;
import java.util.List;

/**
 * Drafts in the drafter's vocabulary, proposes in the target's (speculative/drafter.py).
 *
 * <p>State: the committed text as drafter ids (draftIds) and how many of those positions hold valid
 * KV (kvLen). After every commit the bytes of draftIds equal the bytes of the committed target ids,
 * and kvLen < draftIds.size(), so the next draft always feeds at least one token. Proposals: walk
 * the drafted tokens left to right; take the longest cached n-gram (probability = product of the
 * drafted tokens' probabilities), else the direct mapping, else stop. Exact mode restricts the
 * drafter to directly mapped tokens and skips the n-gram cache.
 */
public final class CrossVocabDrafter implements Proposer {
    private final CausalLm lm;
    private final VocabMap map;
    private final DraftLenPolicy policy;
    private final boolean exact;
    private final double temperature;
    private final int targetVocab;
    private final NGramCache cache; // may be null
    private final int bosId; // -1: none
    private IntList draftIds = new IntList();
    private int kvLen;
    private int fedLen;
    private int[] drafts = new int[0];
    private int calls;

    public CrossVocabDrafter(CausalLm lm, VocabMap map, DraftLenPolicy policy, boolean exact, double temperature,
                             int targetVocab, NGramCache cache, int bosId) {
        this.lm = lm;
        this.map = map;
        this.policy = policy;
        this.exact = exact;
        this.temperature = temperature;
        this.targetVocab = targetVocab;
        this.cache = cache;
        this.bosId = bosId;
    }

    @Override
    public void reset(int[] promptTargetIds) {
        policy.newContext();
        calls = 0;
        IntList ids = map.translate(promptTargetIds);
        if (bosId >= 0 && (ids.size() == 0 || ids.get(0) != bosId)) {
            IntList withBos = new IntList();
            withBos.add(bosId);
            withBos.addAll(ids.toArray());
            ids = withBos;
        }
        draftIds = ids;
        kvLen = CachedTokens.reusable(lm, ids.toArray()); // the drafter's cache may hold its start
        fedLen = 0;
    }

    @Override
    public int calls() {
        return calls;
    }

    public DraftLenPolicy policy() {
        return policy;
    }

    public int kvLen() {
        return kvLen;
    }

    public int[] draftIds() {
        return draftIds.toArray();
    }

    private float[] draftProbs(float[] logits) {
        float[] probs = Sampling.logitsToProbs(logits, temperature);
        return exact ? Sampling.restrictToDirect(probs, map) : probs;
    }

    /**
     * The law a token was drawn from, as logits, for the policy's confidence features: greedy, the
     * drafter's own logits (a one-hot law says nothing); sampling, log of the (restricted) law.
     */
    private float[] law(float[] logits, float[] probs) {
        if (temperature <= 0) {
            return logits;
        }
        float[] out = new float[probs.length];
        for (int i = 0; i < out.length; i++) {
            out[i] = (float) Math.log(probs[i]); // log 0 = -inf: no weight in the features
        }
        return out;
    }

    /** Drafter tokens for this step; fills q (probability of each) and rows (their distributions). */
    private int[] draft(Uniforms uniforms, List<Float> q, List<float[]> rows) {
        int room = lm.maxSeqLen() - draftIds.size() - 1;
        int k = Math.max(0, Math.min(policy.nextDraftLen(), room));
        IntList out = new IntList();
        int[] feed = draftIds.slice(kvLen, draftIds.size());
        int start = kvLen;
        for (int i = 0; i < k; i++) {
            float[] logits = lm.forwardTail(feed, start, 1)[0]; // only the next token's row is read
            calls++;
            if (logits.length > map.draftVocabSize) { // a graph padded past its tokenizer never drafts a pad
                logits = java.util.Arrays.copyOf(logits, map.draftVocabSize);
            }
            float[] probs = draftProbs(logits);
            start += feed.length;
            if (temperature > 0 && !Sampling.hasMass(probs)) {
                break; // exact: no mapped token kept any probability; the target samples this step itself
            }
            int d = temperature <= 0 ? Sampling.argmax(probs) : Sampling.sample(probs, uniforms.next());
            out.add(d);
            q.add(probs[d]);
            rows.add(probs);
            if (map.isDraftEos(d) || !policy.keepDrafting(i, DraftLenPolicy.confidenceFeatures(law(logits, probs)))) {
                break;
            }
            feed = new int[] {d};
        }
        fedLen = start;
        drafts = out.toArray();
        return drafts;
    }

    private float[] targetRow(float[] draftRow) {
        float[] row = new float[targetVocab];
        for (int d = 0; d < Math.min(draftRow.length, map.draftVocabSize); d++) {
            int t = map.draftToTarget(d);
            if (t >= 0 && t < targetVocab) {
                row[t] += draftRow[d];
            }
        }
        return row;
    }

    /** Draft, then turn the drafter tokens into target-vocabulary proposals. */
    @Override
    public Proposal propose(Uniforms uniforms) {
        List<Float> qTok = new ArrayList<>();
        List<float[]> draftRows = new ArrayList<>();
        int[] d = draft(uniforms, qTok, draftRows);
        IntList ids = new IntList();
        IntList spans = new IntList();
        List<Float> qs = new ArrayList<>();
        List<float[]> outRows = new ArrayList<>();
        boolean sampling = temperature > 0;
        int j = 0;
        while (j < d.length) {
            int[] hit = cache != null && !exact ? cache.match(d, j) : null;
            int t;
            int n;
            float q;
            if (hit != null && hit[1] >= 2) {
                t = hit[0];
                n = hit[1];
                q = 1f;
                for (int i = j; i < j + n; i++) {
                    q *= qTok.get(i);
                }
            } else if (map.draftToTarget(d[j]) >= 0) {
                t = map.draftToTarget(d[j]);
                n = 1;
                q = qTok.get(j);
            } else {
                break;
            }
            if (sampling) {
                float[] row = targetRow(draftRows.get(j));
                if (n == 1) {
                    q = row[t]; // marginal over every drafter token spelling t
                } else {
                    row[t] = q;
                }
                outRows.add(row);
            }
            ids.add(t);
            qs.add(q);
            spans.add(n);
            j += n;
        }
        float[] qArr = new float[qs.size()];
        boolean[] merged = new boolean[qs.size()];
        for (int i = 0; i < qArr.length; i++) {
            qArr[i] = qs.get(i);
            merged[i] = spans.get(i) > 1;
        }
        float[][] rows = sampling ? outRows.toArray(new float[0][]) : null;
        return new Proposal(ids.toArray(), qArr, rows, spans.toArray(), merged, d.length);
    }

    /** Keep the accepted drafts, append the target's own token, roll the KV pointer back. */
    @Override
    public void commit(Proposal proposal, int nAccepted, int nextId) {
        int kept = 0;
        for (int i = 0; i < nAccepted; i++) {
            kept += proposal.spans[i];
        }
        int[] tail = map.targetToDraft(nextId);
        int oldLen = draftIds.size();
        for (int i = 0; i < kept; i++) {
            draftIds.add(drafts[i]);
        }
        draftIds.addAll(tail);
        kvLen = Math.max(0, Math.min(Math.min(fedLen, oldLen + kept), draftIds.size() - 1));
        if (cache != null && tail.length >= 2) {
            cache.update(tail, nextId);
        }
        policy.update(proposal.nDrafted, kept);
    }
}
