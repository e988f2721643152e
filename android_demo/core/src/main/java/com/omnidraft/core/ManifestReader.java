package com.omnidraft.core;

import java.io.File;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * Reads manifest.json and verifies every listed file (presence, size, sha256) with the JDK only.
 * Schema 1: one drafter and one target ("graphs"). Schema 2: one drafter ("graphs") and 2 to
 * {@link #MAX_TARGETS} targets ("targets": name -> graph, mapping_hash, vocab_map, ngram_cache,
 * tokenizer, expected); {@link BundleManifest#select} picks one.
 */
public final class ManifestReader {
    public static final int SCHEMA_VERSION = 2; // the newest schema this reader reads
    public static final int MULTI_TARGET_VERSION = 2;
    public static final int MAX_TARGETS = 64;
    public static final String FORMAT = "omnidraft-bundle";
    public static final String MANIFEST_NAME = "manifest.json";

    private ManifestReader() {}

    public static BundleManifest read(File bundleDir) throws IOException {
        File path = new File(bundleDir, MANIFEST_NAME);
        if (!path.isFile()) {
            throw new BundleException(path.getPath(), "missing: not an exported bundle (or the export did not finish)");
        }
        String text = new String(Files2.readAll(path), StandardCharsets.UTF_8);
        try {
            return parse(text, path.getPath());
        } catch (IllegalArgumentException e) {
            throw new BundleException(path.getPath(), "malformed manifest (" + e.getMessage() + ")");
        }
    }

    /** Reads the manifest, then checks each listed file; any mismatch names the file. */
    public static BundleManifest verify(File bundleDir) throws IOException {
        BundleManifest manifest = read(bundleDir);
        for (Map.Entry<String, BundleManifest.FileEntry> item : manifest.files().entrySet()) {
            String rel = item.getKey();
            BundleManifest.FileEntry entry = item.getValue();
            File file = new File(bundleDir, rel);
            if (rel.isEmpty() || rel.startsWith("/") || rel.contains("\\") || ("/" + rel + "/").contains("/../")) {
                throw new BundleException(file.getPath(), "path escapes the bundle folder");
            }
            if (!file.isFile()) {
                throw new BundleException(file.getPath(), "missing (listed in " + MANIFEST_NAME + " as " + entry.role + ")");
            }
            if (file.length() != entry.size) {
                throw new BundleException(file.getPath(), "size " + file.length() + " B != " + entry.size
                        + " B in manifest (truncated?)");
            }
            if (!Files2.sha256Hex(file).equals(entry.sha256)) {
                throw new BundleException(file.getPath(), "sha256 mismatch with manifest (corrupted or replaced)");
            }
        }
        String source = new File(bundleDir, MANIFEST_NAME).getPath();
        listed(manifest, manifest.drafter.file, "graph", source);
        if (manifest.target != null) {
            listed(manifest, manifest.target.file, "graph", source);
        }
        for (Map.Entry<String, BundleManifest.Target> t : manifest.targets().entrySet()) {
            BundleManifest.Target target = t.getValue();
            for (String rel : new String[] {target.graph.file, target.vocabMap, target.ngramCache, target.expected}) {
                listed(manifest, rel, "target " + t.getKey() + ": file", source);
            }
        }
        return manifest;
    }

    private static void listed(BundleManifest manifest, String rel, String what, String source) throws BundleException {
        if (!manifest.files().containsKey(rel)) {
            throw new BundleException(source, what + " " + rel + " not in files");
        }
    }

    @SuppressWarnings("unchecked")
    static BundleManifest parse(String text, String source) throws BundleException {
        Object root = MiniJson.parse(text);
        if (!(root instanceof Map) || !FORMAT.equals(((Map<String, Object>) root).get("format"))) {
            throw new BundleException(source, "not an omnidraft bundle manifest (format != " + FORMAT + ")");
        }
        Map<String, Object> m = (Map<String, Object>) root;
        Object version = m.get("schema_version");
        if (!(version instanceof Long) || (Long) version > SCHEMA_VERSION) {
            throw new BundleException(source, "schema_version " + version + " is newer than this reader ("
                    + SCHEMA_VERSION + "); update the app");
        }
        int schema = ((Long) version).intValue();
        Map<String, Object> graphs = object(m, "graphs");
        Map<String, BundleManifest.Target> targets = targets(m, schema);
        if (targets.isEmpty() != graphs.containsKey("target")) {
            throw new IllegalArgumentException("\"graphs\" holds the drafter and, in a schema 1 manifest only, the target");
        }
        Map<String, BundleManifest.FileEntry> files = new LinkedHashMap<>();
        Map<String, Object> listed = object(m, "files");
        for (String rel : listed.keySet()) {
            Map<String, Object> e = object(listed, rel);
            files.put(rel, new BundleManifest.FileEntry(string(e, "sha256"), integer(e, "size"), string(e, "role")));
        }
        BundleManifest.Graph target = targets.isEmpty() ? graph(object(graphs, "target")) : null;
        BundleManifest out = new BundleManifest(schema, string(m, "backend"), (int) integer(m, "draft_len"),
                graph(object(graphs, "drafter")), target, files, targets);
        if (m.get("mapping_hash") instanceof String) {
            out.mappingHash = (String) m.get("mapping_hash");
        }
        if (m.get("extras") instanceof Map) {
            out.extras = object(m, "extras");
        }
        return out;
    }

    /** Schema 2's "targets" (absent: none); a schema 1 manifest that has them is refused. */
    private static Map<String, BundleManifest.Target> targets(Map<String, Object> m, int schema) {
        Map<String, BundleManifest.Target> out = new LinkedHashMap<>();
        if (!m.containsKey("targets")) {
            if (schema >= MULTI_TARGET_VERSION) {
                throw new IllegalArgumentException("\"targets\" missing from a schema " + schema + " manifest");
            }
            return out;
        }
        Map<String, Object> listed = object(m, "targets");
        if (schema < MULTI_TARGET_VERSION || listed.size() < 2 || listed.size() > MAX_TARGETS) {
            throw new IllegalArgumentException("\"targets\": 2 to " + MAX_TARGETS + " targets in a schema "
                    + MULTI_TARGET_VERSION + " manifest, got " + listed.size() + " in schema " + schema);
        }
        for (String name : listed.keySet()) {
            Map<String, Object> t = object(listed, name);
            if (!("targets/" + name + "/" + BundleManifest.TARGET_TOKENIZER).equals(t.get("tokenizer"))) {
                throw new IllegalArgumentException("\"targets\": target " + name + " has its tokenizer in targets/"
                        + name + "/" + BundleManifest.TARGET_TOKENIZER + ", not " + t.get("tokenizer"));
            }
            out.put(name, new BundleManifest.Target(graph(object(t, "graph")), string(t, "mapping_hash"),
                    string(t, "vocab_map"), string(t, "ngram_cache"), string(t, "tokenizer"), string(t, "expected")));
        }
        return out;
    }

    private static BundleManifest.Graph graph(Map<String, Object> g) {
        BundleManifest.Graph out = new BundleManifest.Graph(string(g, "file"), string(g, "preset"),
                (int) integer(g, "vocab_size"), (int) integer(g, "max_seq_len"));
        out.tokenizer = g.get("tokenizer") instanceof String ? (String) g.get("tokenizer") : "";
        out.nLayers = g.get("n_layers") instanceof Long ? ((Long) g.get("n_layers")).intValue() : 0;
        out.nKvHeads = g.get("n_kv_heads") instanceof Long ? ((Long) g.get("n_kv_heads")).intValue() : 0;
        out.headDim = g.get("head_dim") instanceof Long ? ((Long) g.get("head_dim")).intValue() : 0;
        out.seqLen = g.get("seq_len") instanceof Long ? ((Long) g.get("seq_len")).intValue() : -1;
        return out;
    }

    @SuppressWarnings("unchecked")
    private static Map<String, Object> object(Map<String, Object> map, String key) {
        return (Map<String, Object>) typed(map, key, Map.class, "an object");
    }

    private static String string(Map<String, Object> map, String key) {
        return (String) typed(map, key, String.class, "a string");
    }

    private static long integer(Map<String, Object> map, String key) {
        return (Long) typed(map, key, Long.class, "an integer");
    }

    private static Object typed(Map<String, Object> map, String key, Class<?> type, String what) {
        Object value = map.get(key);
        if (!type.isInstance(value)) {
            throw new IllegalArgumentException("\"" + key + "\" missing or not " + what);
        }
        return value;
    }
}
