package com.omnidraft.core;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;

import java.io.IOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.junit.Test;

/**
 * Who reads only the last row (CausalLm.forwardLast, as protocols.last_logits in Python): the
 * target prefill and every drafter call; verification reads every row (forward). Fake models that
 * record their calls drive the real decoder; greedy speculative output equals the target's own
 * greedy continuation.
 */
public class ForwardLastTest {
    /** A deterministic model over its cache: row i scores next = rule(slots[0 .. start+i]). */
    static final class RecordingLm implements CausalLm {
        final List<String> calls = new ArrayList<>();
        private final int vocab;
        private final int mul;
        private final int[] slots = new int[64];

        RecordingLm(int vocab, int mul) {
            this.vocab = vocab;
            this.mul = mul;
        }

        /** Never 0 (the EOS of the map used here), so a run goes to maxNewTokens. */
        static int next(int[] context, int n, int vocab, int mul) {
            long h = n;
            for (int i = 0; i < n; i++) {
                h = h * mul + context[i];
            }
            return (int) Math.floorMod(h, (long) vocab - 1) + 1;
        }

        private float[][] rows(int[] ids, int startPos) {
            System.arraycopy(ids, 0, slots, startPos, ids.length); // the cache takes all of ids
            float[][] rows = new float[ids.length][vocab];
            for (int i = 0; i < ids.length; i++) {
                rows[i][next(slots, startPos + i + 1, vocab, mul)] = 1f;
            }
            return rows;
        }

        @Override
        public float[][] forward(int[] ids, int startPos) {
            calls.add("forward " + ids.length + "@" + startPos);
            return rows(ids, startPos);
        }

        @Override
        public float[] forwardLast(int[] ids, int startPos) {
            calls.add("last " + ids.length + "@" + startPos);
            float[][] rows = rows(ids, startPos);
            return rows[rows.length - 1];
        }

        @Override
        public int vocabSize() {
            return vocab;
        }

        @Override
        public int maxSeqLen() {
            return slots.length;
        }
    }

    private static int[] targetGreedy(int[] prompt, int n, int vocab, int mul) {
        int[] ctx = Arrays.copyOf(prompt, prompt.length + n);
        for (int i = 0; i < n; i++) {
            ctx[prompt.length + i] = RecordingLm.next(ctx, prompt.length + i, vocab, mul);
        }
        return Arrays.copyOfRange(ctx, prompt.length, ctx.length);
    }

    @Test
    public void prefillAndDrafterReadTheLastRowVerificationEveryRow() throws IOException {
        VocabMap map = VocabMap.read(VocabMapTest.golden(), "mapper_v1.bin"); // 6 drafter, 10 target ids
        RecordingLm target = new RecordingLm(map.targetVocabSize, 7);
        RecordingLm drafter = new RecordingLm(map.draftVocabSize, 3);
        SpeculativeDecoder.Config cfg = new SpeculativeDecoder.Config(false, 0.0, 12, map.targetEos(),
                map.targetVocabSize);
        SpeculativeDecoder dec = new SpeculativeDecoder(target, drafter, map, new DraftLenPolicy.Fixed(3), null,
                cfg, -1);
        int[] prompt = {3, 7, 1, 4, 9};
        Stats stats = new Stats();
        int[] out = dec.generate(prompt, Uniforms.seeded(0), stats, null);

        assertArrayEquals(targetGreedy(prompt, 12, map.targetVocabSize, 7), out);
        assertEquals("last 4@0", target.calls.get(0)); // prefill: all but the last prompt token
        List<String> verify = target.calls.subList(1, target.calls.size());
        assertTrue(target.calls.toString(), !verify.isEmpty() && verify.stream().allMatch(c -> c.startsWith("forward ")));
        assertTrue(target.calls.toString(), verify.stream().anyMatch(c -> !c.startsWith("forward 1@")));
        assertEquals(stats.targetCalls, target.calls.size());
        assertTrue(drafter.calls.toString(), !drafter.calls.isEmpty()
                && drafter.calls.stream().allMatch(c -> c.startsWith("last ")));
        assertEquals(stats.drafterCalls, drafter.calls.size());
    }

    @Test
    public void theDefaultIsTheLastRowOfForward() {
        RecordingLm full = new RecordingLm(10, 7);
        CausalLm plain = new CausalLm() { // no override: the interface's default
            @Override
            public float[][] forward(int[] ids, int startPos) {
                return full.forward(ids, startPos);
            }

            @Override
            public int vocabSize() {
                return 10;
            }

            @Override
            public int maxSeqLen() {
                return 64;
            }
        };
        int[] ids = {5, 2, 8};
        float[] last = plain.forwardLast(ids, 0);
        assertArrayEquals(new RecordingLm(10, 7).forward(ids, 0)[2], last, 0f);
        assertEquals(List.of("forward 3@0"), full.calls);
        // same cache effect: the next call sees every token the last-row call fed
        assertArrayEquals(new RecordingLm(10, 7).forward(new int[] {5, 2, 8, 6}, 0)[3],
                plain.forwardLast(new int[] {6}, 3), 0f);
    }
}
