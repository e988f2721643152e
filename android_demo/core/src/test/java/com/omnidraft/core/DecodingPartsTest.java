package com.omnidraft.core;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNull;

import java.nio.charset.StandardCharsets;
import org.junit.Test;

/** Small parts of the decoding loop; the golden traces test them together against Python. */
public class DecodingPartsTest {
    @Test
    public void lruAndLfuEvictInPythonsOrder() {
        NGramCache lru = new NGramCache(2, 0, NGramCacheFile.POLICY_LRU);
        lru.update(new int[] {1, 2}, 10);
        lru.update(new int[] {3, 4}, 11);
        assertArrayEquals(new int[] {10, 2}, lru.match(new int[] {0, 1, 2, 9}, 1)); // touch {1,2}
        lru.update(new int[] {5, 6}, 12); // evicts {3,4}, the least recently used
        assertNull(lru.match(new int[] {3, 4}, 0));
        assertEquals(2, lru.size());
        NGramCache lfu = new NGramCache(2, 0, NGramCacheFile.POLICY_LFU);
        lfu.update(new int[] {1, 2}, 10);
        lfu.update(new int[] {1, 2}, 10);
        lfu.update(new int[] {3, 4}, 11);
        lfu.update(new int[] {5, 6}, 12); // evicts {3,4}: fewest uses
        NGramCacheFile f = lfu.toFile(100, 100);
        assertArrayEquals(new int[] {5, 6}, f.entries().get(0).draftIds());
        assertArrayEquals(new int[] {1, 2}, f.entries().get(1).draftIds());
        assertEquals(2, f.entries().get(1).uses);
    }

    @Test
    public void longestNGramWins() {
        NGramCache c = new NGramCache(8, 0, NGramCacheFile.POLICY_LRU);
        c.update(new int[] {1, 2}, 10);
        c.update(new int[] {1, 2, 3}, 11);
        assertArrayEquals(new int[] {11, 3}, c.match(new int[] {1, 2, 3}, 0));
        assertArrayEquals(new int[] {10, 2}, c.match(new int[] {1, 2, 4}, 0));
    }

    @Test
    public void utf8IsHeldBackUntilComplete() {
        StringBuilder out = new StringBuilder();
        byte[] euro = "€".getBytes(StandardCharsets.UTF_8); // 3 bytes
        assertEquals(0, TextStream.decode(new byte[] {euro[0], euro[1]}, false, out));
        assertEquals("", out.toString());
        assertEquals(3, TextStream.decode(euro, false, out));
        assertEquals("€", out.toString());
        StringBuilder bad = new StringBuilder();
        TextStream.decode(new byte[] {(byte) 0xE2, (byte) 0x82, 'a', (byte) 0xFF}, true, bad);
        assertEquals("\uFFFDa\uFFFD", bad.toString()); // one U+FFFD per maximal subpart
    }

    @Test
    public void heuristicPolicyAddsTwoOrDropsOne() {
        DraftLenPolicy p = new DraftLenPolicy.Heuristic(4);
        p.update(4, 4);
        assertEquals(6, p.nextDraftLen());
        p.update(6, 2);
        assertEquals(5, p.nextDraftLen());
    }

    @Test
    public void lookupProposesTheLongestLatestMatchAndKeepsItsIndexAcrossAShrink() {
        LookupProposer lp = new LookupProposer(1, 2, 8, true); // values from Python's LookupProposer
        lp.reset(new int[] {5, 6, 7, 5, 6});
        LookupProposer.Candidate c = lp.propose(3);
        assertArrayEquals(new int[] {7, 5, 6}, c.ids);
        assertEquals(2, c.ngram);
        lp.extend(new int[] {9, 5, 6, 7}); // the 9th id drops the oldest half
        assertEquals(5, lp.size());
        assertEquals(0, lp.propose(4).ngram); // (6, 7) and (7,) were dropped with it
        lp.extend(new int[] {9});
        c = lp.propose(3);
        assertArrayEquals(new int[] {5, 6, 7}, c.ids); // (9,) from the rebuilt index
        assertEquals(1, c.ngram);
        assertEquals(0, lp.propose(0).ids.length);
    }

    @Test
    public void costArithmeticIsPythons() throws FormatException {
        CostProfile p = new CostProfile(new double[] {10, 12, 15}, new double[] {2}, 0.5, 1.0);
        assertEquals(21.0, p.target(5), 0.0); // extrapolated from the last two widths
        assertEquals(6.0, p.drafter(3), 0.0);
        assertEquals(5.0, p.marginalMs(0, true), 0.0);
        assertEquals(3.0, p.marginalMs(2, false), 0.0);
        assertEquals(8, p.bestLength(0.9, 8, false));
        assertEquals(0, p.bestLength(0.5, 8, true));
        assertEquals(false, p.extensionPays(0, 4, 1.0, 0.5, 10.0));
        double[] f = DraftLenPolicy.confidenceFeatures(new float[] {2f, 1f, Float.NEGATIVE_INFINITY, 0.5f});
        assertArrayEquals(new double[] {0.6285317307360451, 0.3464885761479334, 1.0}, f, 1e-7);
        String[][] bad = {
            {"{\"target_ms\": [1.0], \"lookup_ms\": -1}", "x.json: not a cost profile (lookup_ms must be >= 0, got -1.0)"},
            {"{\"drafter_ms\": [1.0]}", "x.json: not a cost profile ('target_ms')"},
        };
        for (String[] b : bad) {
            try {
                CostProfile.fromJson(b[0], "x.json");
                throw new AssertionError("accepted " + b[0]);
            } catch (FormatException e) {
                assertEquals(b[1], e.getMessage());
            }
        }
    }

    @Test
    public void samplingFollowsTheInverseCdf() {
        float[] probs = {0f, 0.25f, 0f, 0.75f};
        assertEquals(1, Sampling.sample(probs, 0.0));
        assertEquals(1, Sampling.sample(probs, 0.2));
        assertEquals(3, Sampling.sample(probs, 0.25));
        assertEquals(3, Sampling.sample(probs, 0.999999));
    }

    @Test
    public void runtimeMustNotBeOlderThanTheExporter() {
        assertEquals(-1, RuntimeVersions.compare("1.5.1", "1.10.0"));
        assertEquals(0, RuntimeVersions.compare("1.5", "1.5.0"));
        BundleManifest m = new BundleManifest(1, "xnnpack", 4, null, null, new java.util.HashMap<>());
        assertNull(RuntimeVersions.problem(m, "1.0.0")); // no versions recorded: warning only
        java.util.Map<String, Object> versions = new java.util.HashMap<>();
        versions.put("executorch", "1.5.1");
        java.util.Map<String, Object> extras = new java.util.HashMap<>();
        extras.put("runtime_versions", versions);
        m.extras = extras;
        assertNull(RuntimeVersions.problem(m, "1.5.1"));
        assertEquals(true, RuntimeVersions.problem(m, "1.4.0").contains("exported with executorch 1.5.1"));
    }
}
