package com.omnidraft.core;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.Arrays;
import java.util.Base64;
import java.util.List;
import java.util.Map;

/**
 * Replays recorded runs (omnidraft_deploy/golden/trace.py), one after the other as one Python
 * decoder made them: a CausalLm per role that returns the recorded logits for the recorded call of
 * the current run and fails on any other call, and the recorded uniforms.
 */
final class TraceReplay implements Uniforms {
    private List<Object> calls = new java.util.ArrayList<>();
    private double[] uniforms = new double[0];
    private int nextCall;
    private int nextUniform;

    /** Replay this run next (the last one's leftovers are checked by the caller). */
    void begin(Map<String, Object> run) {
        this.calls = ByteLevelBpe.asList(run.get("calls"), "calls");
        List<Object> u = ByteLevelBpe.asList(run.get("uniforms"), "uniforms");
        this.uniforms = new double[u.size()];
        for (int i = 0; i < uniforms.length; i++) {
            uniforms[i] = ((Number) u.get(i)).doubleValue();
        }
        nextCall = 0;
        nextUniform = 0;
    }

    @Override
    public double next() {
        if (nextUniform >= uniforms.length) {
            throw new AssertionError("java drew uniform #" + nextUniform + "; the trace recorded " + uniforms.length);
        }
        return uniforms[nextUniform++];
    }

    /** Empty when every recorded call and uniform was consumed, else what is left. */
    String leftover() {
        if (nextCall != calls.size() || nextUniform != uniforms.length) {
            return "java made " + nextCall + " of " + calls.size() + " recorded calls and drew " + nextUniform
                    + " of " + uniforms.length + " uniforms";
        }
        return "";
    }

    CausalLm model(String role, int vocab, int maxSeqLen) {
        return new CausalLm() {
            @Override
            public float[][] forward(int[] ids, int startPos) {
                return call(role, vocab, ids, startPos);
            }

            @Override
            public int vocabSize() {
                return vocab;
            }

            @Override
            public int maxSeqLen() {
                return maxSeqLen;
            }
        };
    }

    private float[][] call(String role, int vocab, int[] ids, int start) {
        String made = role + ".forward(" + Arrays.toString(ids) + ", " + start + ")";
        if (nextCall >= calls.size()) {
            throw new AssertionError("call #" + nextCall + ": java made " + made + "; the trace has no more calls");
        }
        Map<String, Object> c = ByteLevelBpe.asMap(calls.get(nextCall), "call");
        String recorded = c.get("role") + ".forward(" + Arrays.toString(Golden.ints(c.get("ids"))) + ", "
                + c.get("start") + ")";
        if (!made.equals(recorded)) {
            throw new AssertionError("call #" + nextCall + ": java made " + made + "; the trace recorded " + recorded);
        }
        nextCall++;
        List<Object> rows = ByteLevelBpe.asList(c.get("rows"), "rows");
        float[][] out = new float[rows.size()][];
        for (int r = 0; r < out.length; r++) {
            if (rows.get(r) == null) {
                continue; // not recorded: the decoder must not read it (null -> NullPointerException)
            }
            Map<String, Object> row = ByteLevelBpe.asMap(rows.get(r), "row");
            ByteBuffer idx = le(Base64.getDecoder().decode((String) row.get("idx")));
            ByteBuffer val = le(Base64.getDecoder().decode((String) row.get("val")));
            out[r] = new float[vocab];
            Arrays.fill(out[r], Float.NEGATIVE_INFINITY);
            while (idx.hasRemaining()) {
                out[r][idx.getInt()] = val.getFloat();
            }
        }
        return out;
    }

    private static ByteBuffer le(byte[] b) {
        return ByteBuffer.wrap(b).order(ByteOrder.LITTLE_ENDIAN);
    }
}
