package com.omnidraft.core;

import java.io.File;
import java.io.IOException;
import java.util.ArrayList;

/** A verified bundle folder: its manifest plus the warm n-gram cache (empty when none shipped). */
public final class Bundle {
    public static final String NGRAM_FILE = "ngram_cache.bin";

    public final File dir;
    public final BundleManifest manifest;
    public final NGramCacheFile ngramCache;

    private Bundle(File dir, BundleManifest manifest, NGramCacheFile ngramCache) {
        this.dir = dir;
        this.manifest = manifest;
        this.ngramCache = ngramCache;
    }

    /**
     * Verifies every file against manifest.json, then reads ngram_cache.bin if listed. The cache's
     * vocabulary sizes must fit the graphs' (a graph may pad its vocabulary beyond the tokenizer's).
     */
    public static Bundle open(File dir) throws IOException {
        BundleManifest manifest = ManifestReader.verify(dir);
        if (!manifest.files().containsKey(NGRAM_FILE)) {
            NGramCacheFile empty = new NGramCacheFile(NGramCacheFormat.VERSION, NGramCacheFile.POLICY_LRU,
                    manifest.drafter.vocabSize, manifest.target.vocabSize, new ArrayList<>());
            return new Bundle(dir, manifest, empty);
        }
        File path = new File(dir, NGRAM_FILE);
        NGramCacheFile cache = NGramCacheFormat.readFile(path);
        if (cache.draftVocabSize > manifest.drafter.vocabSize || cache.targetVocabSize > manifest.target.vocabSize) {
            throw new NGramFormatException(path.getPath(), "built for vocabularies " + cache.draftVocabSize + "/"
                    + cache.targetVocabSize + ", larger than the graphs' " + manifest.drafter.vocabSize + "/"
                    + manifest.target.vocabSize + ": the cache belongs to another model pair");
        }
        return new Bundle(dir, manifest, cache);
    }

    /** A few lines for the demo screen and the command line. */
    public String summary() {
        long bytes = new File(dir, NGRAM_FILE).length();
        return "bundle " + dir.getPath() + " verified (" + manifest.files().size() + " files)\n"
                + "backend " + manifest.backend + ", draft_len " + manifest.draftLen + "\n"
                + "drafter " + manifest.drafter.preset + " (" + manifest.drafter.file + ", vocab "
                + manifest.drafter.vocabSize + ")\n"
                + "target " + manifest.target.preset + " (" + manifest.target.file + ", vocab "
                + manifest.target.vocabSize + ")\n"
                + "n-gram cache: " + ngramCache.entries().size() + " entries, " + ngramCache.policyName()
                + ", " + bytes + " B on disk";
    }
}
