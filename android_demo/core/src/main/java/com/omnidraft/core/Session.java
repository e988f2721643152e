package com.omnidraft.core;

import java.io.File;
import java.io.IOException;

/**
 * Everything the app runs between two model calls, wired from a verified bundle: vocabulary map,
 * target tokenizer, warm n-gram cache (the session file next to the bundle when one was saved),
 * greedy speculative decoding, streaming text, and the atomic save of the grown cache. Drafting as
 * `omnidraft run` drafts (runtime/run.py): with a measured cost profile in the session folder
 * (cost_profile.json, as `omnidraft profile` writes it into the Python state folder), cost-aware
 * draft lengths up to 2 * the manifest's draft_len plus lookup proposals; without one, the +2/-1
 * rule from the manifest's draft_len. The app supplies only the two CausalLm implementations.
 * A multi-target bundle's target is chosen by name; each target keeps its own session cache
 * ({@code cacheDir/targets/NAME}, as the Python runtime's per-target state folder).
 */
public final class Session {
    public static final String VOCAB_MAP = BundleManifest.VOCAB_MAP;
    public static final String SESSION_CACHE = "ngram_cache.session.bin";

    /** Opens one graph of the bundle (ExecuTorch or ONNX Runtime on the phone). */
    public interface ModelLoader {
        CausalLm load(File graphFile, BundleManifest.Graph info, BundleManifest manifest) throws IOException;
    }

    public final Bundle bundle;
    public final VocabMap map;
    public final Tokenizer tokenizer;
    public final NGramCache cache;
    public final CostProfile profile; // null: no cost_profile.json in the session folder (+2/-1)
    private final File cacheFile;
    private final SpeculativeDecoder decoder;

    /** cacheDir: a writable folder for the session cache (the app's files folder). */
    public Session(File bundleDir, File cacheDir, ModelLoader loader, int maxNewTokens) throws IOException {
        this(bundleDir, null, cacheDir, loader, maxNewTokens);
    }

    /** targetName: which target of a multi-target bundle (null: the only one). */
    public Session(File bundleDir, String targetName, File cacheDir, ModelLoader loader, int maxNewTokens)
            throws IOException {
        bundle = Bundle.open(bundleDir, targetName);
        BundleManifest m = bundle.manifest;
        BundleManifest.Target parts = m.parts();
        File mapFile = bundle.file(parts.vocabMap);
        map = VocabMap.readFile(mapFile);
        if (map.draftVocabSize > m.drafter.vocabSize || map.targetVocabSize > m.target.vocabSize) {
            throw new FormatException(mapFile.getPath(), "vocabulary sizes ("
                    + map.draftVocabSize + ", " + map.targetVocabSize + ") exceed the graphs' (" + m.drafter.vocabSize
                    + ", " + m.target.vocabSize + ")");
        }
        tokenizer = Tokenizer.load(bundle.file(parts.tokenizer));
        File state = m.targets().isEmpty() ? cacheDir : new File(new File(cacheDir, "targets"), bundle.targetName);
        if (!state.isDirectory() && !state.mkdirs()) {
            throw new IOException(state.getPath() + ": cannot create the target's session folder");
        }
        cacheFile = new File(state, SESSION_CACHE);
        NGramCacheFile warm = cacheFile.isFile() ? NGramCacheFormat.readFile(cacheFile) : bundle.ngramCache;
        if (warm.draftVocabSize != map.draftVocabSize || warm.targetVocabSize != map.targetVocabSize) {
            throw new NGramFormatException(cacheFile.getPath(), "built for vocabularies " + warm.draftVocabSize + "/"
                    + warm.targetVocabSize + ", the map has " + map.draftVocabSize + "/" + map.targetVocabSize);
        }
        // as the Python reader: room for every shipped entry (the seed is ~65k merged tokens)
        cache = NGramCache.fromFile(warm, Math.max(NGramCache.DEFAULT_MAX_ENTRIES, warm.entries().size()), 0);
        // wrapped so each keeps a record of its cache: a prompt's cached start is not prefilled again
        CausalLm drafter = new CachingLm(loader.load(new File(bundleDir, m.drafter.file), m.drafter, m));
        CausalLm target = new CachingLm(loader.load(new File(bundleDir, m.target.file), m.target, m));
        SpeculativeDecoder.Config cfg = new SpeculativeDecoder.Config(false, 0.0, maxNewTokens, map.targetEos(),
                map.targetVocabSize);
        File profileFile = new File(state, CostProfile.FILE);
        profile = profileFile.isFile() ? CostProfile.load(profileFile) : null;
        decoder = profile != null
                ? SpeculativeDecoder.costAware(target, drafter, map, profile, m.draftLen, cache, cfg)
                : new SpeculativeDecoder(target, drafter, map, new DraftLenPolicy.Heuristic(m.draftLen), cache, cfg,
                        map.drafterBos());
    }

    SpeculativeDecoder decoder() {
        return decoder;
    }

    /** Which drafting this session runs, for the screen. */
    public String drafting() {
        return profile == null
                ? "drafting: +2/-1 from draft_len " + bundle.manifest.draftLen + " (no " + CostProfile.FILE + ")"
                : "drafting: cost-aware up to " + 2 * bundle.manifest.draftLen + " tokens + lookup (" + CostProfile.FILE
                        + ")";
    }

    /** Streams text to the callback as verification steps commit; returns the stats. */
    public Stats generate(String prompt, java.util.function.BiConsumer<String, Stats> onText) {
        TextStream stream = new TextStream(tokenizer);
        Stats stats = new Stats();
        decoder.generate(tokenizer.encode(prompt), Uniforms.seeded(0), stats,
                (ids, s) -> onText.accept(stream.push(ids), s));
        onText.accept(stream.finish(), stats);
        return stats;
    }

    /** Atomic save of the grown cache (temp file + fsync + rename): the next launch starts warm. */
    public void saveCache() throws IOException {
        cache.save(cacheFile, map.draftVocabSize, map.targetVocabSize);
    }
}
