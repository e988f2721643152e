package com.omnidraft.core;

import java.io.File;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;

/**
 * A verified bundle folder with one target chosen: the manifest's one-target view plus that
 * target's warm n-gram cache (empty when none shipped). A multi-target bundle (schema 2) ships one
 * drafter and several targets, each with its own graph, tokenizer, vocabulary map and cache.
 */
public final class Bundle {
    public static final String NGRAM_FILE = BundleManifest.NGRAM_CACHE;

    public final File dir;
    /** The selected target's view ({@link BundleManifest#select}): {@code manifest.target} is set. */
    public final BundleManifest manifest;
    /** The selected target's name (its preset in a single-target bundle). */
    public final String targetName;
    /** Every target of the bundle, sorted (one for a single-target bundle). */
    public final List<String> targetNames;
    public final NGramCacheFile ngramCache;

    private Bundle(File dir, BundleManifest manifest, List<String> targetNames, NGramCacheFile ngramCache) {
        this.dir = dir;
        this.manifest = manifest;
        this.targetName = manifest.selectedName();
        this.targetNames = targetNames;
        this.ngramCache = ngramCache;
    }

    /** {@link #open(File, String)} of the only target (refused, listing them, where there are several). */
    public static Bundle open(File dir) throws IOException {
        return open(dir, null);
    }

    /**
     * Verifies every file against manifest.json (whichever target is chosen), selects target
     * {@code target} (null: the only one), then reads its n-gram cache if listed. The cache's
     * vocabulary sizes must fit the graphs' (a graph may pad its vocabulary beyond the tokenizer's).
     */
    public static Bundle open(File dir, String target) throws IOException {
        File source = new File(dir, ManifestReader.MANIFEST_NAME);
        BundleManifest all = ManifestReader.verify(dir);
        BundleManifest manifest = all.select(target, source.getPath());
        String rel = manifest.parts().ngramCache;
        if (!manifest.files().containsKey(rel)) {
            NGramCacheFile empty = new NGramCacheFile(NGramCacheFormat.VERSION, NGramCacheFile.POLICY_LRU,
                    manifest.drafter.vocabSize, manifest.target.vocabSize, new ArrayList<>());
            return new Bundle(dir, manifest, all.targetNames(), empty);
        }
        File path = new File(dir, rel);
        NGramCacheFile cache = NGramCacheFormat.readFile(path);
        if (cache.draftVocabSize > manifest.drafter.vocabSize || cache.targetVocabSize > manifest.target.vocabSize) {
            throw new NGramFormatException(path.getPath(), "built for vocabularies " + cache.draftVocabSize + "/"
                    + cache.targetVocabSize + ", larger than the graphs' " + manifest.drafter.vocabSize + "/"
                    + manifest.target.vocabSize + ": the cache belongs to another model pair");
        }
        return new Bundle(dir, manifest, all.targetNames(), cache);
    }

    /** A file or folder of the selected target (vocabulary map, tokenizer, ...), by manifest path. */
    public File file(String rel) {
        return new File(dir, rel);
    }

    /** A few lines for the demo screen and the command line. */
    public String summary() {
        long bytes = file(manifest.parts().ngramCache).length();
        String targets = manifest.targets().isEmpty() ? ""
                : ", target " + targetName + " of " + targetNames.size() + ": " + String.join(", ", targetNames);
        return "bundle " + dir.getPath() + " verified (" + manifest.files().size() + " files)\n"
                + "backend " + manifest.backend + ", draft_len " + manifest.draftLen + "\n"
                + "drafter " + manifest.drafter.preset + " (" + manifest.drafter.file + ", vocab "
                + manifest.drafter.vocabSize + ")\n"
                + "target " + manifest.target.preset + " (" + manifest.target.file + ", vocab "
                + manifest.target.vocabSize + ")" + targets + "\n"
                + "n-gram cache: " + ngramCache.entries().size() + " entries, " + ngramCache.policyName()
                + ", " + bytes + " B on disk";
    }
}
