package com.omnidraft.core;

import java.io.File;
import java.io.IOException;

/**
 * Prompt encoding and token bytes for the shipped tokenizers, read from a bundle's
 * {@code <role>_tokenizer/} folder: {@code tokenizer.json} (byte-level BPE: Llama-3, Qwen2,
 * GPT-2, SmolLM2) or {@code tokenizer.model} (SentencePiece BPE with byte fallback: Llama-2).
 * encode never adds BOS, as the Python tokenizers (omnidraft_deploy/vocab/tokenizers.py).
 */
public interface Tokenizer {
    int[] encode(String text);

    /** Raw UTF-8 bytes the token stands for ("\u2581" -> ' ', "<0x0A>" -> '\n'); specials give their text. */
    byte[] tokenBytes(int id);

    /** Control tokens that decoding drops (skip_special_tokens). */
    boolean isSpecial(int id);

    int vocabSize();

    /** Whether decoding drops the space of the first token (SentencePiece's dummy prefix). */
    boolean stripsLeadingSpace();

    /** The tokenizer in a folder: tokenizer.json (byte-level BPE) or tokenizer.model (SentencePiece). */
    static Tokenizer load(File dir) throws IOException {
        File json = new File(dir, "tokenizer.json");
        if (json.isFile()) {
            return ByteLevelBpe.load(json);
        }
        File model = new File(dir, "tokenizer.model");
        if (model.isFile()) {
            return SentencePieceBpe.load(model);
        }
        throw new FormatException(dir.getPath(), "holds neither tokenizer.json nor tokenizer.model");
    }
}
