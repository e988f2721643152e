package com.omnidraft.core;

import java.io.File;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.LinkedHashMap;
import java.util.Map;

/** Reads manifest.json and verifies every listed file (presence, size, sha256) with the JDK only. */
public final class ManifestReader {
    public static final int SCHEMA_VERSION = 1;
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
        for (BundleManifest.Graph g : new BundleManifest.Graph[] {manifest.drafter, manifest.target}) {
            if (!manifest.files().containsKey(g.file)) {
                throw new BundleException(new File(bundleDir, MANIFEST_NAME).getPath(), "graph " + g.file + " not in files");
            }
        }
        return manifest;
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
        Map<String, Object> graphs = object(m, "graphs");
        Map<String, BundleManifest.FileEntry> files = new LinkedHashMap<>();
        Map<String, Object> listed = object(m, "files");
        for (String rel : listed.keySet()) {
            Map<String, Object> e = object(listed, rel);
            files.put(rel, new BundleManifest.FileEntry(string(e, "sha256"), integer(e, "size"), string(e, "role")));
        }
        BundleManifest out = new BundleManifest(((Long) version).intValue(), string(m, "backend"),
                (int) integer(m, "draft_len"), graph(object(graphs, "drafter")), graph(object(graphs, "target")), files);
        if (m.get("mapping_hash") instanceof String) {
            out.mappingHash = (String) m.get("mapping_hash");
        }
        if (m.get("extras") instanceof Map) {
            out.extras = object(m, "extras");
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
