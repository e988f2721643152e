package com.omnidraft.core;

import java.util.Map;

/**
 * The app's runtime against the bundle's exporter: a program exported by ExecuTorch X needs an
 * ExecuTorch runtime >= X (and the same for ONNX Runtime and the ONNX files it wrote). The exporter
 * versions come from manifest extras.runtime_versions ({"executorch": "1.5.1", "onnxruntime":
 * "1.32.0"}); a bundle without them gets a warning, not a refusal.
 */
public final class RuntimeVersions {
    private RuntimeVersions() {}

    /** "executorch" for .pte bundles (xnnpack), else "onnxruntime" (onnx, qnn). */
    public static String runtimeFor(String backend) {
        return backend.equals("xnnpack") ? "executorch" : "onnxruntime";
    }

    /**
     * Null when the app's runtime can run the bundle, else the problem. Throws nothing: the app
     * shows the line and refuses to load the graphs when the runtime is older than the exporter.
     */
    public static String problem(BundleManifest manifest, String appRuntimeVersion) {
        String runtime = runtimeFor(manifest.backend);
        Object versions = manifest.extras.get("runtime_versions");
        Object exporter = versions instanceof Map ? ((Map<?, ?>) versions).get(runtime) : null;
        if (!(exporter instanceof String)) {
            return null;
        }
        if (compare(appRuntimeVersion, (String) exporter) < 0) {
            return "the bundle was exported with " + runtime + " " + exporter + " but the app ships " + runtime + " "
                    + appRuntimeVersion + ": rebuild the app with a runtime >= " + exporter + " (android_demo/README.md)";
        }
        return null;
    }

    /** Compares dotted numeric versions ("1.5.1" vs "1.10"); a non-numeric part compares as 0. */
    public static int compare(String a, String b) {
        String[] x = a.split("[.+-]");
        String[] y = b.split("[.+-]");
        for (int i = 0; i < Math.max(x.length, y.length); i++) {
            int c = Integer.compare(part(x, i), part(y, i));
            if (c != 0) {
                return c;
            }
        }
        return 0;
    }

    private static int part(String[] parts, int i) {
        if (i >= parts.length) {
            return 0;
        }
        try {
            return Integer.parseInt(parts[i]);
        } catch (NumberFormatException e) {
            return 0;
        }
    }
}
