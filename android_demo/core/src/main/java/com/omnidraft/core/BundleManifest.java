package com.omnidraft.core;

import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;

/** The fields of manifest.json (schema 1, see omnidraft_deploy/bundle/manifest.py) that the app uses. */
public final class BundleManifest {
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

    public final int schemaVersion;
    public final String backend;
    public final int draftLen;
    public final Graph drafter;
    public final Graph target;
    private final Map<String, FileEntry> files;
    public String mappingHash = "";
    public Map<String, Object> extras = Collections.emptyMap(); // free-form (runtime_versions, timings)

    public BundleManifest(int schemaVersion, String backend, int draftLen, Graph drafter, Graph target,
                          Map<String, FileEntry> files) {
        this.schemaVersion = schemaVersion;
        this.backend = backend;
        this.draftLen = draftLen;
        this.drafter = drafter;
        this.target = target;
        this.files = Collections.unmodifiableMap(new LinkedHashMap<>(files));
    }

    /** Relative path -> entry, in manifest order. */
    public Map<String, FileEntry> files() {
        return files;
    }
}
