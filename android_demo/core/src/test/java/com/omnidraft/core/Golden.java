package com.omnidraft.core;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.Map;
import java.util.zip.GZIPInputStream;

/** Locations of the golden files (system properties set by run_java_tests.sh) and JSON helpers. */
final class Golden {
    private Golden() {}

    private static final Map<String, Tokenizer> TOKENIZERS = new java.util.HashMap<>();

    /** The tokenizer in -Domnidraft.tokenizers=DIR/NAME (loaded once per JVM), or null when absent. */
    static synchronized Tokenizer tokenizer(String name) throws IOException {
        File dir = dir("omnidraft.tokenizers");
        File sub = dir == null ? null : new File(dir, name);
        if (sub == null || !sub.isDirectory()) {
            return null;
        }
        Tokenizer tok = TOKENIZERS.get(name);
        if (tok == null) {
            tok = Tokenizer.load(sub);
            TOKENIZERS.put(name, tok);
        }
        return tok;
    }

    /** A folder from a system property, or null when the property is unset. */
    static File dir(String property) {
        String value = System.getProperty(property, "");
        return value.isEmpty() ? null : new File(value);
    }

    static byte[] gunzip(File file) throws IOException {
        try (InputStream in = new GZIPInputStream(new FileInputStream(file), 1 << 16)) {
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            byte[] chunk = new byte[1 << 16];
            for (int n; (n = in.read(chunk)) > 0; ) {
                out.write(chunk, 0, n);
            }
            return out.toByteArray();
        }
    }

    static Map<String, Object> json(File gz) throws IOException {
        return ByteLevelBpe.asMap(MiniJson.parse(new String(gunzip(gz), StandardCharsets.UTF_8)), gz.getName());
    }

    static int[] ints(Object list) {
        List<Object> l = ByteLevelBpe.asList(list, "id list");
        int[] out = new int[l.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = ((Long) l.get(i)).intValue();
        }
        return out;
    }
}
