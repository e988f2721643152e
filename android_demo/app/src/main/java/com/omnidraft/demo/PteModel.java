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
 * input_pos (T,) int64[, cache_slots (start + T,) int64]) -> logits (1, T, V), KV cache as program
 * state (graph_contract.py). cache_slots = 0 .. start + T - 1, the slots the call attends to, is
 * fed to programs whose get_forward_inputs() is 3 (the "prefix" attention; older programs have no
 * such method, or say 2). The program's constant methods (get_vocab_size, get_max_seq_len,
 * get_n_layers) are checked against the manifest before the first call, as
 * runtime/executorch_model.py does.
 */
final class PteModel implements CausalLm {
    private final Module module;
    private final BundleManifest.Graph info;
    private final boolean takesSlots;

    PteModel(File file, BundleManifest.Graph info) throws FormatException {
        this.module = Module.load(file.getAbsolutePath());
        this.info = info;
        check(file, "get_vocab_size", info.vocabSize);
        check(file, "get_max_seq_len", info.maxSeqLen);
        check(file, "get_n_layers", info.nLayers);
        this.takesSlots = forwardInputs() == 3;
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
        int t = ids.length;
        long[] tokens = new long[t];
        long[] pos = new long[t];
        for (int i = 0; i < t; i++) {
            tokens[i] = ids[i];
            pos[i] = startPos + i;
        }
        EValue idsIn = EValue.from(Tensor.fromBlob(tokens, new long[] {1, t}));
        EValue posIn = EValue.from(Tensor.fromBlob(pos, new long[] {t}));
        EValue[] out;
        if (takesSlots) {
            long[] slots = new long[startPos + t];
            for (int i = 0; i < slots.length; i++) {
                slots[i] = i;
            }
            out = module.forward(idsIn, posIn, EValue.from(Tensor.fromBlob(slots, new long[] {slots.length})));
        } else {
            out = module.forward(idsIn, posIn);
        }
        float[] flat = out[0].toTensor().getDataAsFloatArray();
        int v = flat.length / t;
        float[][] rows = new float[t][v];
        for (int i = 0; i < t; i++) {
            System.arraycopy(flat, i * v, rows[i], 0, v);
        }
        return rows;
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
