package com.omnidraft.demo;

import com.omnidraft.core.BundleManifest;
import com.omnidraft.core.CausalLm;
import com.omnidraft.core.FormatException;
import java.io.File;
import org.pytorch.executorch.EValue;
import org.pytorch.executorch.Module;
import org.pytorch.executorch.Tensor;

/**
 * An ExecuTorch .pte graph (XNNPACK) behind the core's CausalLm: forward(token_ids (1, T) int64,
 * input_pos (T,) int64[, cache_slots (start + T,) int64, logit_rows (R,) int64]) -> logits (1, R,
 * V), KV cache as program state (graph_contract.py). Programs whose get_forward_inputs() is 4 (the
 * "prefix" attention; older programs have no such method, or say 2) take cache_slots = 0 .. start
 * + T - 1, the slots the call attends to, and logit_rows, whose length R is how many of the last
 * rows get logits (forwardTail: a prefill scores one row, not T). The program's constant methods (get_vocab_size, get_max_seq_len,
 * get_n_layers) are checked against the manifest before the first call, as
 * runtime/executorch_model.py does.
 */
final class PteModel implements CausalLm {
    private final Module module;
    private final BundleManifest.Graph info;
    private final boolean takesSpans;

    PteModel(File file, BundleManifest.Graph info) throws FormatException {
        this.module = Module.load(file.getAbsolutePath());
        this.info = info;
        check(file, "get_vocab_size", info.vocabSize);
        check(file, "get_max_seq_len", info.maxSeqLen);
        check(file, "get_n_layers", info.nLayers);
        this.takesSpans = forwardInputs() == 4;
    }

    private long forwardInputs() {
        try {
            return module.execute("get_forward_inputs")[0].toInt();
        } catch (RuntimeException e) { // programs before the cache_slots input have no such method
            return 2;
        }
    }

    private void check(File file, String method, long expected) throws FormatException {
        long got = module.execute(method)[0].toInt();
        if (got != expected) {
            throw new FormatException(file.getPath(), method + "() = " + got + " but the manifest says " + expected);
        }
    }

    @Override
    public float[][] forward(int[] ids, int startPos) {
        return forwardTail(ids, startPos, ids.length);
    }

    @Override
    public float[][] forwardTail(int[] ids, int startPos, int rows) {
        int t = ids.length;
        if (rows < 1 || rows > t) {
            throw new IllegalArgumentException("rows " + rows + " of a " + t + "-token call: want 1.." + t);
        }
        long[] tokens = new long[t];
        long[] pos = new long[t];
        for (int i = 0; i < t; i++) {
            tokens[i] = ids[i];
            pos[i] = startPos + i;
        }
        EValue idsIn = EValue.from(Tensor.fromBlob(tokens, new long[] {1, t}));
        EValue posIn = EValue.from(Tensor.fromBlob(pos, new long[] {t}));
        EValue[] out;
        int scored = t;
        if (takesSpans) {
            long[] slots = new long[startPos + t];
            for (int i = 0; i < slots.length; i++) {
                slots[i] = i;
            }
            out = module.forward(idsIn, posIn, EValue.from(Tensor.fromBlob(slots, new long[] {slots.length})),
                    EValue.from(Tensor.fromBlob(new long[rows], new long[] {rows})));
            scored = rows;
        } else {
            out = module.forward(idsIn, posIn);
        }
        float[] flat = out[0].toTensor().getDataAsFloatArray();
        int v = flat.length / scored;
        float[][] tail = new float[rows][v];
        for (int i = 0; i < rows; i++) { // the last rows of what the program scored
            System.arraycopy(flat, (scored - rows + i) * v, tail[i], 0, v);
        }
        return tail;
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
