package com.omnidraft.core;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;

import java.io.File;
import java.io.IOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.List;
import java.util.Map;
import org.junit.Assume;
import org.junit.Test;

/**
 * Golden traces (tests/golden/traces, written by python -m omnidraft_deploy.golden): fed the
 * recorded logits and uniform draws, the Java decoder must make exactly the recorded model calls
 * (ids and start positions of both models, in order) and produce the same tokens, accept counts,
 * draft lengths, text and n-gram cache bytes as the Python reference decoder.
 *
 * <p>Vocabulary maps: a trace's own {@code vocab_map} file, else
 * -Domnidraft.maps=DIR/DRAFTER--TARGET.vocab_map.bin written by the Python test from the same
 * builder. Tokenizers (prompt encoding, text): -Domnidraft.tokenizers=DIR/NAME/.
 *
 * <p>A multi-target trace ({@code "targets"}: one trace per target, all on one drafter) is
 * replayed target by target from ONE multi-target bundle, -Domnidraft.multibundle=DIR (the tests'
 * bundle of those presets and settings): each target is selected by name ({@link Bundle#open}), and
 * its vocabulary map and tokenizer are the files the bundle ships for it.
 */
public class TraceReplayTest {
    @Test
    public void everyTraceReplaysExactly() throws IOException {
        File traces = Golden.dir("omnidraft.traces");
        Assume.assumeTrue("set -Domnidraft.traces", traces != null);
        File[] files = traces.listFiles((d, n) -> n.endsWith(".json.gz") && !n.contains(".vocab_map."));
        assertTrue("no traces in " + traces, files != null && files.length > 0);
        Arrays.sort(files);
        for (File f : files) {
            Map<String, Object> t = Golden.json(f);
            if (t.containsKey("targets")) {
                replayMulti(t);
            } else {
                replay(t, vocabMap(t, traces), Golden.tokenizer((String) t.get("target_tokenizer")));
            }
        }
    }

    /**
     * The replay can fail: a cost trace with its fixed costs changed, or one recorded choice or
     * estimate changed, is refused (the cost profile steers the choices, and each step is checked).
     */
    @Test
    public void perturbedCostTracesAreRefused() throws IOException {
        File traces = Golden.dir("omnidraft.traces");
        Assume.assumeTrue("set -Domnidraft.traces", traces != null);
        File f = new File(traces, "tiny-llama3-greedy-cost.json.gz");
        assertTrue(f + " missing", f.isFile());
        Map<String, Object> t = Golden.json(f);
        VocabMap map = vocabMap(t, traces);
        Tokenizer tok = Golden.tokenizer((String) t.get("target_tokenizer"));
        Assume.assumeTrue("vocabulary map and tokenizer files given", map != null && tok != null);
        refused("drafter 3x dearer", f, map, tok, "step", x -> {
            List<Object> ms = ByteLevelBpe.asList(ByteLevelBpe.asMap(x.get("cost_profile"), "p").get("drafter_ms"), "ms");
            ms.replaceAll(v -> 3 * ((Number) v).doubleValue());
        });
        refused("a step's source", f, map, tok, "source", x -> step(x, 0, 1).put("source", "lookup"));
        refused("a step's acceptance rate 1e-4 off", f, map, tok, "acceptance rate",
                x -> step(x, 0, 3).put("rate", 1.0001 * ((Number) step(x, 0, 3).get("rate")).doubleValue()));
        refused("a step's lookup candidate", f, map, tok, "lookup candidate",
                x -> step(x, 2, 0).put("lookup", new ArrayList<Object>()));
    }

    private interface Edit {
        void apply(Map<String, Object> trace);
    }

    private static Map<String, Object> step(Map<String, Object> t, int run, int step) {
        Map<String, Object> r = ByteLevelBpe.asMap(ByteLevelBpe.asList(t.get("runs"), "runs").get(run), "run");
        return ByteLevelBpe.asMap(ByteLevelBpe.asList(r.get("steps"), "steps").get(step), "step");
    }

    private static void refused(String what, File f, VocabMap map, Tokenizer tok, String expected, Edit edit)
            throws IOException {
        Map<String, Object> t = Golden.json(f);
        edit.apply(t);
        String message = null;
        try {
            replay(t, map, tok);
        } catch (AssertionError e) {
            message = e.getMessage();
        }
        assertTrue(what + ": the perturbed trace replayed", message != null);
        assertTrue(what + ": " + message, message.contains(expected));
        System.out.println("perturbed trace (" + what + "): refused: " + message);
    }

    /** Each target's trace, its map and tokenizer from one multi-target bundle (class comment). */
    private static void replayMulti(Map<String, Object> t) throws IOException {
        String name = (String) t.get("name");
        File dir = Golden.dir("omnidraft.multibundle");
        if (dir == null) {
            System.out.println("multi-target trace " + name + ": skipped (-Domnidraft.multibundle not given)");
            return;
        }
        Map<String, Object> settings = ByteLevelBpe.asMap(t.get("bundle"), "bundle");
        List<String> names = new ArrayList<>();
        for (Object o : ByteLevelBpe.asList(t.get("targets"), "targets")) {
            Map<String, Object> sub = ByteLevelBpe.asMap(o, "target trace");
            String target = (String) sub.get("target");
            Bundle b = Bundle.open(dir, target);
            BundleManifest m = b.manifest;
            String where = name + " " + target;
            assertEquals(where + ": drafter", t.get("drafter"), m.drafter.preset);
            assertEquals(where + ": drafter vocab", num(sub, "drafter_model_vocab"), m.drafter.vocabSize);
            assertEquals(where + ": max_seq_len", num(settings, "max_seq_len"), m.drafter.maxSeqLen);
            assertEquals(where + ": target vocab", num(sub, "target_model_vocab"), m.target.vocabSize);
            assertEquals(where + ": target max_seq_len", num(sub, "target_max_seq_len"), m.target.maxSeqLen);
            assertEquals(where + ": draft_len", num(sub, "draft_len"), m.draftLen);
            assertEquals(where + ": mapping hash", sub.get("mapping_hash"), m.mappingHash);
            VocabMap map = VocabMap.readFile(b.file(m.parts().vocabMap));
            replay(sub, map, Tokenizer.load(b.file(m.parts().tokenizer)));
            names.add(target);
        }
        System.out.println("multi-target trace " + name + ": targets " + String.join(", ", names)
                + " replayed from one bundle (drafter " + t.get("drafter") + ")");
    }

    static void replay(Map<String, Object> t, VocabMap map, Tokenizer tok) throws IOException {
        String name = (String) t.get("name");
        if (map == null || tok == null) {
            System.out.println("trace " + name + ": skipped (vocabulary map or tokenizer files not given)");
            return;
        }
        Object bos = t.get("drafter_bos");
        assertEquals(name + ": drafter BOS", bos == null ? -1 : ((Long) bos).intValue(), map.drafterBos());
        boolean exact = "exact".equals(t.get("mode"));
        SpeculativeDecoder.Config cfg = new SpeculativeDecoder.Config(exact, ((Number) t.get("temperature")).doubleValue(),
                num(t, "max_new_tokens"), Golden.ints(t.get("eos_ids")), num(t, "vocab_limit"));
        int policyId = "lfu".equals(t.get("cache_policy")) ? NGramCacheFile.POLICY_LFU : NGramCacheFile.POLICY_LRU;
        NGramCache cache = new NGramCache(num(t, "cache_max_entries"), 0, policyId);
        TraceReplay replay = new TraceReplay(); // one decoder for every run, as Python's
        CausalLm target = replay.model("target", num(t, "target_model_vocab"), num(t, "target_max_seq_len"));
        CausalLm drafter = replay.model("drafter", num(t, "drafter_model_vocab"), num(t, "drafter_max_seq_len"));
        StepCheck steps = null;
        SpeculativeDecoder dec;
        if ("cost".equals(t.get("policy"))) { // the runtime's decoder with a cost profile
            assertLookupDefaults(name, ByteLevelBpe.asMap(t.get("lookup"), "lookup"));
            CostProfile profile = CostProfile.fromMap(ByteLevelBpe.asMap(t.get("cost_profile"), "cost_profile"), name);
            SpeculativeDecoder wired = SpeculativeDecoder.costAware(target, drafter, map, profile, num(t, "draft_len"),
                    cache, cfg);
            steps = new StepCheck((HybridProposer) wired.proposer());
            dec = new SpeculativeDecoder(target, steps, cfg);
        } else {
            DraftLenPolicy policy = DraftLenPolicy.byName((String) t.get("policy"), num(t, "draft_len"), null);
            dec = new SpeculativeDecoder(target, drafter, map, policy, cache, cfg, map.drafterBos());
        }
        List<Object> runs = ByteLevelBpe.asList(t.get("runs"), "runs");
        int merged = 0;
        int accepted = 0;
        int nSteps = 0;
        for (int r = 0; r < runs.size(); r++) {
            Map<String, Object> run = ByteLevelBpe.asMap(runs.get(r), "run");
            String where = name + " run " + r;
            int[] prompt = Golden.ints(run.get("prompt_ids"));
            assertArrayEquals(where + ": prompt ids", prompt, tok.encode((String) run.get("prompt")));
            replay.begin(run);
            if (steps != null) {
                steps.begin(ByteLevelBpe.asList(run.get("steps"), "steps"), where);
            }
            TextStream stream = new TextStream(tok);
            StringBuilder text = new StringBuilder();
            Stats stats = new Stats();
            int[] out = dec.generate(prompt, replay, stats, (ids, s) -> text.append(stream.push(ids)));
            text.append(stream.finish());
            assertArrayEquals(where + ": output ids", Golden.ints(run.get("output_ids")), out);
            assertEquals(where + ": " + replay.leftover(), "", replay.leftover());
            if (steps != null) {
                steps.finish();
            }
            assertEquals(where + ": accept counts", list(run.get("accept_counts")), stats.acceptCounts);
            assertEquals(where + ": draft lengths", list(run.get("draft_len_trace")), stats.draftLenTrace);
            assertEquals(where + ": merged proposals", num(run, "merged_proposed"), stats.mergedProposed);
            assertEquals(where + ": merged accepted", num(run, "merged_accepted"), stats.mergedAccepted);
            assertEquals(where + ": target calls", num(run, "target_calls"), stats.targetCalls);
            assertEquals(where + ": drafter calls", num(run, "drafter_calls"), stats.drafterCalls);
            assertEquals(where + ": text", run.get("text"), text.toString());
            byte[] bytes = NGramCacheFormat.write(cache.toFile(map.draftVocabSize, map.targetVocabSize));
            assertArrayEquals(where + ": n-gram cache bytes",
                    Base64.getDecoder().decode((String) run.get("ngram_cache_after")), bytes);
            merged += stats.mergedProposed;
            accepted += stats.accepted;
            nSteps += stats.acceptCounts.size();
        }
        System.out.println("trace " + name + ": " + runs.size() + " runs replayed exactly (" + nSteps + " steps, "
                + accepted + " accepted, " + merged + " merged proposals, cache " + cache.size() + " entries)");
    }

    /** The trace's lookup settings are the ones SpeculativeDecoder.costAware uses (LookupConfig()). */
    private static void assertLookupDefaults(String name, Map<String, Object> lookup) {
        assertEquals(name + ": lookup min_ngram", 1, num(lookup, "min_ngram"));
        assertEquals(name + ": lookup max_ngram", 4, num(lookup, "max_ngram"));
        assertEquals(name + ": lookup max_tokens", 8192, num(lookup, "max_tokens"));
        assertEquals(name + ": lookup keep_history", Boolean.TRUE, lookup.get("keep_history"));
    }

    private static VocabMap vocabMap(Map<String, Object> t, File traces) throws IOException {
        Object own = t.get("vocab_map");
        if (own != null) {
            File f = new File(traces, (String) own);
            return VocabMap.read(Golden.gunzip(f), f.getPath());
        }
        File maps = Golden.dir("omnidraft.maps");
        File f = maps == null ? null : new File(maps, t.get("drafter") + "--" + t.get("target") + ".vocab_map.bin");
        return f != null && f.isFile() ? VocabMap.readFile(f) : null;
    }

    private static int num(Map<String, Object> m, String key) {
        return ((Number) m.get(key)).intValue();
    }

    private static List<Integer> list(Object o) {
        List<Integer> out = new ArrayList<>();
        for (int v : Golden.ints(o)) {
            out.add(v);
        }
        return out;
    }
}
