package com.omnidraft.core;

import java.io.File;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.text.Normalizer;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * Byte-level BPE from a Hugging Face tokenizer.json (Llama-3, Qwen2, GPT-2, SmolLM2), the subset
 * of the format those files use: added tokens split out first (longest match, on the raw text),
 * normalizer none / NFC / NFKC, pre-tokenizers Split (regex, Isolated), Digits and ByteLevel, the
 * BPE model with ranked merges and ignore_merges. Anything else is refused naming the file.
 */
public final class ByteLevelBpe implements Tokenizer {
    private static final char[] BYTE_TO_CHAR = new char[256];
    private static final int[] CHAR_TO_BYTE = new int[512];

    static {
        java.util.Arrays.fill(CHAR_TO_BYTE, -1);
        int n = 0;
        for (int b = 0; b < 256; b++) {
            boolean printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
            char c = printable ? (char) b : (char) (256 + n++);
            BYTE_TO_CHAR[b] = c;
            CHAR_TO_BYTE[c] = b;
        }
    }

    private final Map<String, Integer> vocab;
    private final Map<String, Integer> mergeRanks;
    private final boolean ignoreMerges;
    private final String normalizer; // null, "NFC" or "NFKC"
    private final List<PreTokenizer> preTokenizers;
    private final AddedTokens added;
    private final byte[][] bytes;
    private final boolean[] special;

    private ByteLevelBpe(Map<String, Integer> vocab, Map<String, Integer> mergeRanks, boolean ignoreMerges,
                         String normalizer, List<PreTokenizer> preTokenizers, AddedTokens added,
                         byte[][] bytes, boolean[] special) {
        this.vocab = vocab;
        this.mergeRanks = mergeRanks;
        this.ignoreMerges = ignoreMerges;
        this.normalizer = normalizer;
        this.preTokenizers = preTokenizers;
        this.added = added;
        this.bytes = bytes;
        this.special = special;
    }

    public static ByteLevelBpe load(File file) throws IOException {
        String source = file.getPath();
        Object doc;
        try {
            doc = MiniJson.parse(new String(Files2.readAll(file), StandardCharsets.UTF_8));
        } catch (IllegalArgumentException e) {
            throw new FormatException(source, "not JSON (" + e.getMessage() + ")");
        }
        try {
            return fromJson(asMap(doc, "tokenizer.json"), source);
        } catch (ClassCastException | NullPointerException | IllegalArgumentException e) {
            throw new FormatException(source, "unsupported or malformed tokenizer.json (" + e.getMessage() + ")");
        }
    }

    @SuppressWarnings("unchecked")
    static Map<String, Object> asMap(Object o, String what) {
        if (!(o instanceof Map)) {
            throw new IllegalArgumentException(what + " is not an object");
        }
        return (Map<String, Object>) o;
    }

    @SuppressWarnings("unchecked")
    static List<Object> asList(Object o, String what) {
        if (!(o instanceof List)) {
            throw new IllegalArgumentException(what + " is not an array");
        }
        return (List<Object>) o;
    }

    private static ByteLevelBpe fromJson(Map<String, Object> doc, String source) throws FormatException {
        Map<String, Object> model = asMap(doc.get("model"), "model");
        if (!"BPE".equals(model.get("type"))) {
            throw new FormatException(source, "model type " + model.get("type") + " is not BPE");
        }
        Map<String, Integer> vocab = new HashMap<>();
        int size = 0;
        for (Map.Entry<String, Object> e : asMap(model.get("vocab"), "model.vocab").entrySet()) {
            int id = ((Long) e.getValue()).intValue();
            vocab.put(e.getKey(), id);
            size = Math.max(size, id + 1);
        }
        Map<String, Integer> ranks = new HashMap<>();
        List<Object> merges = asList(model.get("merges"), "model.merges");
        for (int r = 0; r < merges.size(); r++) {
            Object m = merges.get(r);
            String key = m instanceof String ? (String) m
                    : asList(m, "merge").get(0) + " " + asList(m, "merge").get(1);
            ranks.putIfAbsent(key, r);
        }
        boolean ignoreMerges = Boolean.TRUE.equals(model.get("ignore_merges"));
        List<Object> addedList = doc.get("added_tokens") == null ? new ArrayList<>()
                : asList(doc.get("added_tokens"), "added_tokens");
        for (Object o : addedList) {
            size = Math.max(size, ((Long) asMap(o, "added token").get("id")).intValue() + 1);
        }
        byte[][] bytes = new byte[size][];
        boolean[] special = new boolean[size];
        for (Map.Entry<String, Integer> e : vocab.entrySet()) {
            bytes[e.getValue()] = pieceBytes(e.getKey(), source);
        }
        AddedTokens added = new AddedTokens();
        for (Object o : addedList) {
            Map<String, Object> t = asMap(o, "added token");
            int id = ((Long) t.get("id")).intValue();
            String content = (String) t.get("content");
            bytes[id] = content.getBytes(StandardCharsets.UTF_8);
            special[id] = Boolean.TRUE.equals(t.get("special"));
            added.add(content, id);
        }
        for (int i = 0; i < size; i++) {
            if (bytes[i] == null) {
                throw new FormatException(source, "id " + i + " has no token");
            }
        }
        return new ByteLevelBpe(vocab, ranks, ignoreMerges, normalizer(doc.get("normalizer"), source),
                PreTokenizer.parse(doc.get("pre_tokenizer"), source), added, bytes, special);
    }

    private static String normalizer(Object spec, String source) throws FormatException {
        if (spec == null) {
            return null;
        }
        Object type = asMap(spec, "normalizer").get("type");
        if ("NFC".equals(type) || "NFKC".equals(type)) {
            return (String) type;
        }
        throw new FormatException(source, "normalizer " + type + " is not supported (none, NFC, NFKC)");
    }

    private static byte[] pieceBytes(String piece, String source) throws FormatException {
        byte[] out = new byte[piece.length()];
        for (int i = 0; i < piece.length(); i++) {
            char c = piece.charAt(i);
            int b = c < CHAR_TO_BYTE.length ? CHAR_TO_BYTE[c] : -1;
            if (b < 0) {
                throw new FormatException(source, "vocabulary piece '" + piece + "' is not byte-level");
            }
            out[i] = (byte) b;
        }
        return out;
    }

    @Override
    public int[] encode(String text) {
        IntList ids = new IntList();
        for (AddedTokens.Segment seg : added.split(text)) {
            if (seg.id >= 0) {
                ids.add(seg.id);
                continue;
            }
            String s = seg.text;
            if (normalizer != null) {
                s = Normalizer.normalize(s, "NFC".equals(normalizer) ? Normalizer.Form.NFC : Normalizer.Form.NFKC);
            }
            List<String> pieces = new ArrayList<>();
            pieces.add(s);
            for (PreTokenizer p : preTokenizers) {
                pieces = p.apply(pieces);
            }
            for (String piece : pieces) {
                encodeWord(toByteLevel(piece), ids);
            }
        }
        return ids.toArray();
    }

    static String toByteLevel(String piece) {
        byte[] b = piece.getBytes(StandardCharsets.UTF_8);
        char[] out = new char[b.length];
        for (int i = 0; i < b.length; i++) {
            out[i] = BYTE_TO_CHAR[b[i] & 0xFF];
        }
        return new String(out);
    }

    private void encodeWord(String word, IntList out) {
        if (word.isEmpty()) {
            return;
        }
        Integer whole = ignoreMerges ? vocab.get(word) : null;
        if (whole != null) {
            out.add(whole);
            return;
        }
        List<String> symbols = new ArrayList<>();
        for (int i = 0; i < word.length(); i++) {
            symbols.add(word.substring(i, i + 1));
        }
        while (symbols.size() > 1) {
            int best = -1;
            int bestRank = Integer.MAX_VALUE;
            for (int i = 0; i + 1 < symbols.size(); i++) {
                Integer rank = mergeRanks.get(symbols.get(i) + " " + symbols.get(i + 1));
                if (rank != null && rank < bestRank) {
                    bestRank = rank;
                    best = i;
                }
            }
            if (best < 0) {
                break;
            }
            symbols.set(best, symbols.get(best) + symbols.remove(best + 1));
        }
        for (String s : symbols) {
            Integer id = vocab.get(s);
            if (id != null) {
                out.add(id);
            }
        }
    }

    @Override
    public byte[] tokenBytes(int id) {
        return bytes[id].clone();
    }

    @Override
    public boolean isSpecial(int id) {
        return special[id];
    }

    @Override
    public int vocabSize() {
        return bytes.length;
    }

    @Override
    public boolean stripsLeadingSpace() {
        return false;
    }
}
