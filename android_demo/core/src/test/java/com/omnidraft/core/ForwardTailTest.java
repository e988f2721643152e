package com.omnidraft.core;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertThrows;
import static org.junit.Assert.assertTrue;

import java.io.File;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.junit.Test;

/**
 * Who reads which rows (CausalLm.forwardTail, as protocols.tail_logits in Python): the first
 * target call is the prompt's prefill and verifies the first proposals (prompt + proposals at 0,
 * their rows and the next token's only: no prefill call of its own); every later target call reads
 * all its rows (all are verification rows); every drafter call reads the last row. Fake models that
 * record their calls drive the real decoder; greedy speculative output equals the target's own
 * greedy continuation, up to the last KV slot as target-only decoding.
 */
public class ForwardTailTest {
    /** A deterministic model over its cache: row i scores next = rule(slots[0 .. start+i]). */
    static final class RecordingLm implements CausalLm {
        final List<String> calls = new ArrayList<>();
        private final int vocab;
        private final int mul;
        private final int[] slots; // the KV cache: a feed past maxSeqLen() - 1 throws

        RecordingLm(int vocab, int mul) {
            this(vocab, mul, 64);
        }

        RecordingLm(int vocab, int mul, int maxSeqLen) {
            this.vocab = vocab;
            this.mul = mul;
            this.slots = new int[maxSeqLen];
        }

        /** Never 0 (the EOS of the map used here), so a run goes to maxNewTokens or capacity. */
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
        public float[][] forwardTail(int[] ids, int startPos, int rows) {
            calls.add("tail " + ids.length + "@" + startPos + "/" + rows);
            float[][] all = rows(ids, startPos);
            return Arrays.copyOfRange(all, all.length - rows, all.length);
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

    /** {T, start, rows} of a recorded "tail T@start/rows" call. */
    private static int[] tail(String call) {
        assertTrue(call + " is not a forwardTail call", call.startsWith("tail "));
        String[] parts = call.substring(5).split("[@/]");
        return new int[] {Integer.parseInt(parts[0]), Integer.parseInt(parts[1]), Integer.parseInt(parts[2])};
    }

    private static int[] targetGreedy(int[] prompt, int n, int vocab, int mul) {
        int[] ctx = Arrays.copyOf(prompt, prompt.length + n);
        for (int i = 0; i < n; i++) {
            ctx[prompt.length + i] = RecordingLm.next(ctx, prompt.length + i, vocab, mul);
        }
        return Arrays.copyOfRange(ctx, prompt.length, ctx.length);
    }

    private static SpeculativeDecoder decoder(VocabMap map, CausalLm target, CausalLm drafter, int maxNew) {
        SpeculativeDecoder.Config cfg = new SpeculativeDecoder.Config(false, 0.0, maxNew, map.targetEos(),
                map.targetVocabSize);
        return new SpeculativeDecoder(target, drafter, map, new DraftLenPolicy.Fixed(3), null, cfg, -1);
    }

    /**
     * Issue 47 (drafter.py _pick): in exact mode a drafter row with no mass on the directly mapped
     * ids drafts nothing that step; the target samples it (before, sample walked to index -1).
     */
    @Test
    public void exactModeDraftsNothingFromARowWithoutMappedMass() throws IOException {
        File golden = new File(System.getProperty("omnidraft.golden", "../../tests/golden/ngram_v1.bin"));
        VocabMap map = VocabMap.readFile(new File(golden.getParentFile(), "mapper_v2.bin")); // drafter 1, 6 unmapped
        CausalLm drafter = new CausalLm() { // all mass on drafter ids without a target twin
            @Override
            public float[][] forward(int[] ids, int startPos) {
                float[][] rows = new float[ids.length][map.draftVocabSize];
                for (float[] row : rows) {
                    for (int d = 0; d < row.length; d++) {
                        row[d] = map.draftToTarget(d) >= 0 ? -1e6f : 0f;
                    }
                }
                return rows;
            }

            @Override
            public int vocabSize() {
                return map.draftVocabSize;
            }

            @Override
            public int maxSeqLen() {
                return 64;
            }
        };
        RecordingLm target = new RecordingLm(map.targetVocabSize, 7);
        SpeculativeDecoder.Config cfg = new SpeculativeDecoder.Config(true, 1.0, 6, new int[0], map.targetVocabSize);
        SpeculativeDecoder dec = new SpeculativeDecoder(target, drafter, map, new DraftLenPolicy.Fixed(3), null, cfg,
                -1);
        Stats stats = new Stats();
        int[] out = dec.generate(new int[] {3, 7, 1}, Uniforms.seeded(1), stats, null);
        assertEquals(6, out.length);
        assertEquals(0, stats.proposed); // one drafter call a step, no draft
        assertEquals(stats.targetCalls, stats.drafterCalls);
    }

    @Test
    public void aPromptsCachedStartIsNotPrefilledAgainAndChangesNothing() throws IOException {
        VocabMap map = VocabMap.read(VocabMapTest.golden(), "mapper_v1.bin");
        RecordingLm target = new RecordingLm(map.targetVocabSize, 7);
        RecordingLm drafter = new RecordingLm(map.draftVocabSize, 3);
        SpeculativeDecoder dec = decoder(map, new CachingLm(target), new CachingLm(drafter), 12);
        int[] first = {3, 7, 1, 4, 9, 2, 5, 6};
        int[] second = {3, 7, 1, 4, 9, 2, 8, 1, 5}; // the same 6-id "system turn"
        dec.generate(first, Uniforms.seeded(0), new Stats(), null);
        target.calls.clear();
        drafter.calls.clear();
        Stats stats = new Stats();
        int[] out = dec.generate(second, Uniforms.seeded(0), stats, null);

        assertEquals(6, stats.promptReused);
        int[] call = tail(target.calls.get(0)); // the prefill starts after the cached start
        assertEquals(target.calls.toString(), 6, call[1]);
        assertArrayEquals(targetGreedy(second, 12, map.targetVocabSize, 7), out);
        for (String c : drafter.calls) { // nor does the drafter read its cached start again
            assertTrue(drafter.calls.toString(), !c.endsWith("@0/1"));
        }
        // the same prompt again: all but its last id cached, the same output
        Stats again = new Stats();
        assertArrayEquals(out, dec.generate(second, Uniforms.seeded(0), again, null));
        assertEquals(second.length - 1, again.promptReused);
    }

    @Test
    public void cachedTokensRecordWhatEachCallWrote() {
        CachedTokens c = new CachedTokens();
        c.fed(new int[] {1, 2, 3, 4}, 0);
        c.fed(new int[] {5, 6, 7}, 4);
        c.fed(new int[] {9}, 5); // 6 was rejected; 7 lay past the new write
        assertEquals(6, c.size());
        assertEquals(3, c.reusable(new int[] {1, 2, 3, 8, 8}));
        assertEquals(5, c.reusable(new int[] {1, 2, 3, 4, 5, 9}));
        c.fed(new int[] {7}, 9); // past the record: unknown entries before it
        assertEquals(6, c.size());
        c.keep(2);
        assertEquals(2, c.reusable(new int[] {1, 2, 3, 4}));
        assertEquals(0, CachedTokens.reusable(new RecordingLm(4, 3), new int[] {1, 2}));
    }

    @Test
    public void theFirstTargetCallIsThePrefillAndVerifiesTheFirstProposals() throws IOException {
        VocabMap map = VocabMap.read(VocabMapTest.golden(), "mapper_v1.bin"); // 6 drafter, 10 target ids
        RecordingLm target = new RecordingLm(map.targetVocabSize, 7);
        RecordingLm drafter = new RecordingLm(map.draftVocabSize, 3);
        int[] prompt = {3, 7, 1, 4, 9};
        Stats stats = new Stats();
        int[] out = decoder(map, target, drafter, 12).generate(prompt, Uniforms.seeded(0), stats, null);

        assertArrayEquals(targetGreedy(prompt, 12, map.targetVocabSize, 7), out);
        int[] first = tail(target.calls.get(0)); // prompt + proposals at 0, rows = proposals + 1
        assertEquals(target.calls.toString(), 0, first[1]);
        assertEquals(target.calls.toString(), prompt.length + first[2] - 1, first[0]);
        assertTrue("the first step proposed nothing: " + target.calls, first[2] > 1);
        assertTrue(target.calls.toString(), stats.acceptCounts.get(0) <= first[2] - 1);
        // no prefill call of its own: one target call per step
        assertEquals(stats.targetCalls, target.calls.size());
        assertEquals(stats.acceptCounts.size(), stats.targetCalls);
        List<String> later = target.calls.subList(1, target.calls.size());
        assertTrue(target.calls.toString(), !later.isEmpty());
        for (String c : later) { // [committed[-1], proposals...]: every row is a verification row
            int[] call = tail(c);
            assertTrue(target.calls.toString(), call[1] >= prompt.length && call[2] == call[0]);
        }
        assertTrue(target.calls.toString(), later.stream().anyMatch(c -> !c.startsWith("tail 1@")));
        assertTrue(drafter.calls.toString(), !drafter.calls.isEmpty()
                && drafter.calls.stream().allMatch(c -> c.startsWith("tail ") && c.endsWith("/1")));
        assertEquals(stats.drafterCalls, drafter.calls.size());
    }

    @Test
    public void everyPromptLengthUpToCapacityDecodesLikeTargetOnly() throws IOException {
        VocabMap map = VocabMap.read(VocabMapTest.golden(), "mapper_v1.bin");
        int cap = 8;
        boolean proposalsInLastSlot = false;
        for (int length = 1; length <= cap; length++) {
            RecordingLm target = new RecordingLm(map.targetVocabSize, 7, cap); // throws past slot cap - 1
            RecordingLm drafter = new RecordingLm(map.draftVocabSize, 3);
            int[] prompt = targetGreedy(new int[] {5}, length, map.targetVocabSize, 3);
            Stats stats = new Stats();
            int[] out = decoder(map, target, drafter, 3 * cap).generate(prompt, Uniforms.seeded(0), stats, null);
            // target-only feeds up to position cap - 1, and the token after it is its last
            assertArrayEquals("prompt length " + length + ": " + target.calls,
                    targetGreedy(prompt, cap - length + 1, map.targetVocabSize, 7), out);
            for (String c : target.calls) { // room = cap - committed: proposals may fill slot cap - 1
                int[] call = tail(c);
                proposalsInLastSlot |= call[2] > 1 && call[1] + call[0] - 1 == cap - 1;
            }
        }
        assertTrue("no verification call reached the last KV slot", proposalsInLastSlot);
        SpeculativeDecoder dec = decoder(map, new RecordingLm(map.targetVocabSize, 7, cap),
                new RecordingLm(map.draftVocabSize, 3), 3 * cap);
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                () -> dec.generate(new int[cap + 1], Uniforms.seeded(0), new Stats(), null));
        assertTrue(e.getMessage(), e.getMessage().contains("does not fit the target's capacity of 8"));
    }

    @Test
    public void theDefaultIsTheTailOfForward() {
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
        float[][] tail = plain.forwardTail(ids, 0, 2);
        float[][] all = new RecordingLm(10, 7).forward(ids, 0);
        assertEquals(2, tail.length);
        assertArrayEquals(all[1], tail[0], 0f);
        assertArrayEquals(all[2], tail[1], 0f);
        assertEquals(List.of("forward 3@0"), full.calls);
        // same cache effect: the next call sees every token the tail call fed
        assertArrayEquals(new RecordingLm(10, 7).forward(new int[] {5, 2, 8, 6}, 0)[3],
                plain.forwardTail(new int[] {6}, 3, 1)[0], 0f);
        assertThrows(IllegalArgumentException.class, () -> plain.forwardTail(ids, 0, 0));
        assertThrows(IllegalArgumentException.class, () -> plain.forwardTail(ids, 0, 4));
    }
}
