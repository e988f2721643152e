package com.omnidraft.core;

import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The fields of manifest.json (schemas 1 and 2, see omnidraft_deploy/bundle/manifest.py and
 * sections.py) that the app uses. A schema 2 manifest lists one drafter and several targets;
 * {@link #select} gives the one-target view the app decodes with (as bundle/targets.py does).
 */
public final class BundleManifest {
    /** The files of the one target of a schema 1 bundle (bundle/targets.py SINGLE). */
    public static final String VOCAB_MAP = "vocab_map.bin";
    public static final String NGRAM_CACHE = "ngram_cache.bin";
    public static final String TARGET_TOKENIZER = "target_tokenizer";
    public static final String EXPECTED = "expected.json";

    /** One listed file: its sha256 (lowercase hex), size in bytes and role. */
    public static final class FileEntry {
        public final String sha256;
        public final long size;
        public final String role;

        public FileEntry(String sha256, long size, String role) {
            this.sha256 = sha256;
            this.size = size;
            this.role = role;
        }
    }

    /** One graph (drafter or target). */
    public static final class Graph {
        public final String file;
        public final String preset;
        public final int vocabSize;
        public final int maxSeqLen;
        public String tokenizer = "";
        public int nLayers;
        public int nKvHeads;
        public int headDim;
        public int seqLen = -1; // -1: dynamic T; else the static T of NPU graphs

        public Graph(String file, String preset, int vocabSize, int maxSeqLen) {
            this.file = file;
            this.preset = preset;
            this.vocabSize = vocabSize;
            this.maxSeqLen = maxSeqLen;
        }
    }

    /** One target: its graph and the files pairing it with the drafter (sections.TargetInfo). */
    public static final class Target {
        public final Graph graph;
        public final String mappingHash;
        public final String vocabMap; // maps/<hex16>.bin, shared by targets of one vocabulary
        public final String ngramCache;
        public final String tokenizer; // folder of its tokenizer files
        public final String expected;

        public Target(Graph graph, String mappingHash, String vocabMap, String ngramCache, String tokenizer,
                      String expected) {
            this.graph = graph;
            this.mappingHash = mappingHash;
            this.vocabMap = vocabMap;
            this.ngramCache = ngramCache;
            this.tokenizer = tokenizer;
            this.expected = expected;
        }
    }

    public final int schemaVersion;
    public final String backend;
    public final int draftLen;
    public final Graph drafter;
    /** The selected target's graph; null on a schema 2 manifest before {@link #select}. */
    public final Graph target;
    private final Map<String, FileEntry> files;
    private final Map<String, Target> targets; // schema 2: name -> target (one, once selected)
    public String mappingHash = "";
    public Map<String, Object> extras = Collections.emptyMap(); // free-form (runtime_versions, timings)

    public BundleManifest(int schemaVersion, String backend, int draftLen, Graph drafter, Graph target,
                          Map<String, FileEntry> files) {
        this(schemaVersion, backend, draftLen, drafter, target, files, Collections.emptyMap());
    }

    public BundleManifest(int schemaVersion, String backend, int draftLen, Graph drafter, Graph target,
                          Map<String, FileEntry> files, Map<String, Target> targets) {
        this.schemaVersion = schemaVersion;
        this.backend = backend;
        this.draftLen = draftLen;
        this.drafter = drafter;
        this.target = target;
        this.files = Collections.unmodifiableMap(new LinkedHashMap<>(files));
        this.targets = Collections.unmodifiableMap(new LinkedHashMap<>(targets));
    }

    /** Relative path -> entry, in manifest order. */
    public Map<String, FileEntry> files() {
        return files;
    }

    /** Name -> target of a schema 2 manifest (in manifest order); empty for schema 1. */
    public Map<String, Target> targets() {
        return targets;
    }

    /** The targets one can choose, sorted: the listed names, or the one target's preset. */
    public List<String> targetNames() {
        List<String> names = new ArrayList<>(targets.isEmpty() ? Collections.singletonList(target.preset) : targets.keySet());
        Collections.sort(names);
        return names;
    }

    /**
     * The manifest of target {@code name}: a schema 1 manifest is its own view (null or its preset);
     * a schema 2 one becomes a one-target view (target = that graph, mappingHash = its map's). Null
     * picks the only target; with several, or an unknown name, the error lists the targets.
     */
    public BundleManifest select(String name, String source) throws BundleException {
        List<String> names = targetNames();
        if (name == null && names.size() > 1) {
            throw new BundleException(source, "a bundle of " + names.size() + " targets (" + String.join(", ", names)
                    + "): choose one by name");
        }
        if (name != null && !names.contains(name)) {
            throw new BundleException(source, "no target '" + name + "' in this bundle; its targets: "
                    + String.join(", ", names));
        }
        if (targets.isEmpty() || target != null) {
            return this;
        }
        String picked = name != null ? name : names.get(0);
        Target t = targets.get(picked);
        BundleManifest view = new BundleManifest(schemaVersion, backend, draftLen, drafter, t.graph, files,
                Collections.singletonMap(picked, t));
        view.mappingHash = t.mappingHash;
        view.extras = extras;
        return view;
    }

    /** The selected target's name: the one listed name of a view, or the preset (schema 1). */
    public String selectedName() {
        return parts() == null ? "" : targets.isEmpty() ? target.preset : targets.keySet().iterator().next();
    }

    /** The selected target's graph and files (null on a schema 2 manifest before select). */
    public Target parts() {
        if (target == null) {
            return null;
        }
        if (targets.isEmpty()) {
            return new Target(target, mappingHash, VOCAB_MAP, NGRAM_CACHE, TARGET_TOKENIZER, EXPECTED);
        }
        return targets.values().iterator().next();
    }
}
