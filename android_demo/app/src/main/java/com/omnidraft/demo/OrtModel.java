package com.omnidraft.demo;

import ai.onnxruntime.OnnxTensor;
import ai.onnxruntime.OrtEnvironment;
import ai.onnxruntime.OrtException;
import ai.onnxruntime.OrtSession;
import com.omnidraft.core.BundleManifest;
import com.omnidraft.core.CausalLm;
import com.omnidraft.core.FormatException;
import java.io.File;
import java.nio.FloatBuffer;
import java.nio.LongBuffer;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Map;

/**
 * An ONNX graph with explicit caches (omnidraft_deploy/graph_contract.py) on ONNX Runtime Android,
 * CPU or the QNN execution provider (HTP). Inputs token_ids (1, T), input_pos (T,), cache_i
 * (1, KV, max_seq_len, D) for i = 0 .. 2L-1; outputs logits (1, T, V) then cache_out_i (1, KV, T, D)
 * (the host writes the chunk's entries at input_pos) or present_i (the whole updated cache). Static-T
 * graphs (seq_len from the manifest) are fed in chunks of exactly T, a short chunk padded with its
 * last token at the following positions (padded rows are dropped and never written back).
 *
 * <p>forwardTail (every drafter call: 1 row; every target call of the decoder: its verification
 * rows, the first one a prefill) feeds {@code logits_from (1,)} int64 = T - rows where a dynamic-T
 * graph lists it among its inputs (forward feeds 0: every row): logits come out (1, rows, V), the
 * lm_head runs rows times, not T, and the cache outputs are those of a full call. Fused graphs
 * (exporters/onnx/fused.py) declare it an overridable initializer (an input with an initializer
 * [0]), which the ONNX Runtime Java API cannot feed: OrtSession.getInputNames() / getInputInfo()
 * list SessionGetInputName's inputs only, as Python's get_inputs(); there is no Java call for
 * SessionGetOverridableInitializer*; and run() throws "Unknown input name" for a name outside
 * getInputNames() and refuses more feeds than getNumInputs() (OrtSession.java in
 * microsoft/onnxruntime, the same in releases with pinned outputs). Such graphs, and static-T ones,
 * take the default: every row computed, the last rows kept.
 */
final class OrtModel implements CausalLm {
    private static final String LOGITS_FROM = "logits_from";
    private final OrtEnvironment env = OrtEnvironment.getEnvironment();
    private final OrtSession session;
    private final BundleManifest.Graph info;
    private final float[][] caches; // 2L buffers of (1, KV, S, D), row-major
    private final boolean chunkOutputs;
    private final boolean takesLogitsFrom; // a plain input the Java API can feed (class comment)
    private final boolean tailAlone; // and T dynamic: one call scores the last rows alone

    OrtModel(File file, BundleManifest.Graph info, boolean qnn) throws OrtException, FormatException {
        OrtSession.SessionOptions options = new OrtSession.SessionOptions();
        if (qnn) {
            Map<String, String> qnnOptions = new HashMap<>();
            qnnOptions.put("backend_path", "libQnnHtp.so");
            options.addQnn(qnnOptions);
        }
        this.session = env.createSession(file.getAbsolutePath(), options);
        this.info = info;
        Map<String, String> meta = session.getMetadata().getCustomMetadata();
        if (!meta.containsKey("omnidraft.graph_info")) {
            throw new FormatException(file.getPath(), "ONNX model has no omnidraft.graph_info metadata (foreign graph)");
        }
        this.caches = new float[2 * info.nLayers][info.nKvHeads * info.maxSeqLen * info.headDim];
        this.chunkOutputs = session.getOutputNames().contains("cache_out_0");
        this.takesLogitsFrom = session.getInputNames().contains(LOGITS_FROM);
        this.tailAlone = takesLogitsFrom && info.seqLen <= 0;
    }

    @Override
    public float[][] forward(int[] ids, int startPos) {
        int t = info.seqLen > 0 ? info.seqLen : ids.length;
        float[][] rows = new float[ids.length][];
        try {
            for (int s = 0; s < ids.length; s += t) {
                int n = Math.min(t, ids.length - s);
                float[][] chunk = call(ids, s, n, t, startPos + s, 0);
                System.arraycopy(chunk, 0, rows, s, n);
            }
        } catch (OrtException e) {
            throw new IllegalStateException("ONNX Runtime failed on " + info.file + ": " + e.getMessage(), e);
        }
        return rows;
    }

    @Override
    public float[][] forwardTail(int[] ids, int startPos, int rows) {
        if (!tailAlone || rows < 1 || rows > ids.length) { // the default refuses rows outside 1..T
            return CausalLm.super.forwardTail(ids, startPos, rows);
        }
        try {
            return call(ids, 0, ids.length, ids.length, startPos, ids.length - rows);
        } catch (OrtException e) {
            throw new IllegalStateException("ONNX Runtime failed on " + info.file + ": " + e.getMessage(), e);
        }
    }

    /**
     * Logits rows of one chunk: its n real rows, or with logitsFrom > 0 (n == t, a graph that takes
     * logits_from) rows logitsFrom .. t - 1 alone.
     */
    private float[][] call(int[] ids, int from, int n, int t, int startPos, int logitsFrom) throws OrtException {
        long[] tokens = new long[t];
        long[] pos = new long[t];
        for (int i = 0; i < t; i++) {
            tokens[i] = ids[from + Math.min(i, n - 1)];
            pos[i] = Math.min(startPos + i, info.maxSeqLen - 1);
        }
        Map<String, OnnxTensor> feeds = new HashMap<>();
        long[] cacheShape = {1, info.nKvHeads, info.maxSeqLen, info.headDim};
        try {
            feeds.put("token_ids", OnnxTensor.createTensor(env, LongBuffer.wrap(tokens), new long[] {1, t}));
            feeds.put("input_pos", OnnxTensor.createTensor(env, LongBuffer.wrap(pos), new long[] {t}));
            if (takesLogitsFrom) { // logits for rows logitsFrom .. only; the cache outputs are unchanged
                long[] rowsFrom = {logitsFrom};
                feeds.put(LOGITS_FROM, OnnxTensor.createTensor(env, LongBuffer.wrap(rowsFrom), new long[] {1}));
            }
            for (int i = 0; i < caches.length; i++) {
                feeds.put("cache_" + i, OnnxTensor.createTensor(env, FloatBuffer.wrap(caches[i]), cacheShape));
            }
            try (OrtSession.Result out = session.run(feeds)) {
                float[][][] logits = (float[][][]) out.get(0).getValue();
                for (int i = 0; i < caches.length; i++) {
                    FloatBuffer entries = ((OnnxTensor) out.get(i + 1)).getFloatBuffer();
                    writeBack(i, entries, n, t, startPos);
                }
                float[][] all = logits[0]; // (rows, V): t - logitsFrom rows
                return logitsFrom > 0 ? all : Arrays.copyOf(all, n);
            }
        } finally {
            for (OnnxTensor x : feeds.values()) {
                x.close();
            }
        }
    }

    /** cache_out_i (1, KV, T, D): the first n rows go to positions startPos..; present_i: whole cache. */
    private void writeBack(int i, FloatBuffer entries, int n, int t, int startPos) {
        int d = info.headDim;
        int s = info.maxSeqLen;
        if (!chunkOutputs) {
            entries.get(caches[i]);
            return;
        }
        float[] chunk = new float[entries.remaining()];
        entries.get(chunk);
        for (int h = 0; h < info.nKvHeads; h++) {
            for (int r = 0; r < n; r++) {
                System.arraycopy(chunk, (h * t + r) * d, caches[i], (h * s + startPos + r) * d, d);
            }
        }
    }

    @Override
    public int vocabSize() {
        return info.vocabSize;
    }

    @Override
    public int maxSeqLen() {
        return info.maxSeqLen;
    }
}
