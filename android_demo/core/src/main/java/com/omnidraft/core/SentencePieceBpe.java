package com.omnidraft.core;

import java.io.File;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.PriorityQueue;

/**
 * SentencePiece BPE with byte fallback (Llama-2) from a tokenizer.model (a serialized ModelProto,
 * read with a minimal protobuf decoder: pieces {piece, score, type}, trainer_spec {model_type,
 * byte_fallback}, normalizer_spec {add_dummy_prefix, remove_extra_whitespaces,
 * escape_whitespaces, precompiled_charsmap}). Encoding follows bpe_model.cc: spaces become U+2581,
 * a dummy prefix U+2581 is prepended, the text is split into characters and the adjacent pair
 * whose concatenation is a piece with the highest score is merged first (ties: leftmost); a final
 * symbol that is not a piece becomes its UTF-8 bytes as {@code <0xXX>} pieces.
 */
public final class SentencePieceBpe implements Tokenizer {
    private static final int NORMAL = 1;
    private static final int UNKNOWN = 2;
    private static final int CONTROL = 3;
    private static final int USER_DEFINED = 4;
    private static final int UNUSED = 5;
    private static final int BYTE = 6;
    private static final String SPACE = "\u2581";

    private final String[] pieces;
    private final float[] scores;
    private final int[] types;
    private final Map<String, Integer> mergeable = new HashMap<>();
    private final int[] byteIds = new int[256];
    private final byte[][] bytes;
    private final boolean addDummyPrefix;
    private final int unkId;

    private SentencePieceBpe(List<String> pieces, List<Float> scores, List<Integer> types, boolean addDummyPrefix) {
        int n = pieces.size();
        this.pieces = pieces.toArray(new String[0]);
        this.scores = new float[n];
        this.types = new int[n];
        this.bytes = new byte[n][];
        this.addDummyPrefix = addDummyPrefix;
        java.util.Arrays.fill(byteIds, -1);
        int unk = -1;
        for (int i = 0; i < n; i++) {
            this.scores[i] = scores.get(i);
            int t = types.get(i);
            this.types[i] = t;
            String p = this.pieces[i];
            if (t == NORMAL || t == USER_DEFINED || t == UNUSED) {
                mergeable.put(p, i);
            }
            if (t == UNKNOWN && unk < 0) {
                unk = i;
            }
            if (t == BYTE) {
                int b = Integer.parseInt(p.substring(3, 5), 16);
                byteIds[b] = i;
                bytes[i] = new byte[] {(byte) b};
            } else if (t == CONTROL || t == UNKNOWN) {
                bytes[i] = p.getBytes(StandardCharsets.UTF_8);
            } else {
                bytes[i] = p.replace(SPACE, " ").getBytes(StandardCharsets.UTF_8);
            }
        }
        this.unkId = unk;
    }

    public static SentencePieceBpe load(File file) throws IOException {
        String source = file.getPath();
        try {
            return parse(Files2.readAll(file), source);
        } catch (IndexOutOfBoundsException | java.nio.BufferUnderflowException | NumberFormatException e) {
            throw new FormatException(source, "not a SentencePiece model (malformed protobuf: " + e + ")");
        }
    }

    static SentencePieceBpe parse(byte[] data, String source) throws FormatException {
        List<String> pieces = new ArrayList<>();
        List<Float> scores = new ArrayList<>();
        List<Integer> types = new ArrayList<>();
        long modelType = 1; // UNIGRAM unless the trainer spec says otherwise
        boolean byteFallback = false;
        boolean dummyPrefix = true;
        boolean removeExtra = true;
        boolean escape = true;
        byte[] charsmap = new byte[0];
        Proto top = new Proto(data, 0, data.length);
        while (top.more()) {
            int tag = top.tag();
            if (tag == 1 && top.wire == 2) {
                Proto p = top.message();
                String piece = "";
                float score = 0f;
                int type = NORMAL;
                while (p.more()) {
                    int f = p.tag();
                    if (f == 1 && p.wire == 2) {
                        piece = new String(p.bytes(), StandardCharsets.UTF_8);
                    } else if (f == 2 && p.wire == 5) {
                        score = p.fixed32();
                    } else if (f == 3 && p.wire == 0) {
                        type = (int) p.varint();
                    } else {
                        p.skip();
                    }
                }
                pieces.add(piece);
                scores.add(score);
                types.add(type);
            } else if (tag == 2 && top.wire == 2) {
                Proto t = top.message();
                while (t.more()) {
                    int f = t.tag();
                    if (f == 3 && t.wire == 0) {
                        modelType = t.varint();
                    } else if (f == 35 && t.wire == 0) {
                        byteFallback = t.varint() != 0;
                    } else {
                        t.skip();
                    }
                }
            } else if (tag == 3 && top.wire == 2) {
                Proto ns = top.message();
                while (ns.more()) {
                    int f = ns.tag();
                    if (f == 2 && ns.wire == 2) {
                        charsmap = ns.bytes();
                    } else if (f == 3 && ns.wire == 0) {
                        dummyPrefix = ns.varint() != 0;
                    } else if (f == 4 && ns.wire == 0) {
                        removeExtra = ns.varint() != 0;
                    } else if (f == 5 && ns.wire == 0) {
                        escape = ns.varint() != 0;
                    } else {
                        ns.skip();
                    }
                }
            } else {
                top.skip();
            }
        }
        if (pieces.isEmpty()) {
            throw new FormatException(source, "not a SentencePiece model (no pieces)");
        }
        if (modelType != 2) {
            throw new FormatException(source, "model type " + modelType + " is not BPE (2)");
        }
        if (!byteFallback || charsmap.length > 0 || removeExtra || !escape) {
            throw new FormatException(source, "unsupported normalizer or trainer spec (needs byte_fallback, "
                    + "identity normalisation, escape_whitespaces and no remove_extra_whitespaces)");
        }
        return new SentencePieceBpe(pieces, scores, types, dummyPrefix);
    }

    @Override
    public int[] encode(String text) {
        if (text.isEmpty()) {
            return new int[0];
        }
        String normalized = (addDummyPrefix ? SPACE : "") + text.replace(" ", SPACE);
        List<String> symbols = new ArrayList<>();
        for (int i = 0; i < normalized.length(); ) {
            int n = Character.charCount(normalized.codePointAt(i));
            symbols.add(normalized.substring(i, i + n));
            i += n;
        }
        merge(symbols);
        IntList out = new IntList();
        for (String s : symbols) {
            if (s == null) {
                continue;
            }
            Integer id = mergeable.get(s);
            if (id != null) {
                out.add(id);
                continue;
            }
            for (byte b : s.getBytes(StandardCharsets.UTF_8)) {
                int bid = byteIds[b & 0xFF];
                out.add(bid >= 0 ? bid : unkId);
            }
        }
        return out.toArray();
    }

    /** bpe_model.cc's agenda: best score first, leftmost on ties; merged-away symbols become null. */
    private void merge(List<String> symbols) {
        int n = symbols.size();
        int[] prev = new int[n];
        int[] next = new int[n];
        for (int i = 0; i < n; i++) {
            prev[i] = i - 1;
            next[i] = i + 1 < n ? i + 1 : -1;
        }
        PriorityQueue<long[]> agenda = new PriorityQueue<>((a, b) -> {
            int c = Float.compare(Float.intBitsToFloat((int) b[2]), Float.intBitsToFloat((int) a[2]));
            return c != 0 ? c : Long.compare(a[0], b[0]);
        });
        for (int i = 0; i + 1 < n; i++) {
            push(agenda, symbols, i, i + 1);
        }
        while (!agenda.isEmpty()) {
            long[] top = agenda.poll();
            int l = (int) top[0];
            int r = (int) top[1];
            String left = symbols.get(l);
            String right = symbols.get(r);
            if (left == null || right == null || next[l] != r || left.length() + right.length() != top[3]) {
                continue; // stale pair
            }
            symbols.set(l, left + right);
            symbols.set(r, null);
            next[l] = next[r];
            if (next[r] >= 0) {
                prev[next[r]] = l;
            }
            if (prev[l] >= 0) {
                push(agenda, symbols, prev[l], l);
            }
            if (next[l] >= 0) {
                push(agenda, symbols, l, next[l]);
            }
        }
    }

    private void push(PriorityQueue<long[]> agenda, List<String> symbols, int l, int r) {
        String merged = symbols.get(l) + symbols.get(r);
        Integer id = mergeable.get(merged);
        if (id != null) {
            agenda.add(new long[] {l, r, Float.floatToIntBits(scores[id]), merged.length()});
        }
    }

    @Override
    public byte[] tokenBytes(int id) {
        return bytes[id].clone();
    }

    @Override
    public boolean isSpecial(int id) {
        return types[id] == CONTROL || types[id] == UNKNOWN;
    }

    @Override
    public int vocabSize() {
        return pieces.length;
    }

    @Override
    public boolean stripsLeadingSpace() {
        return addDummyPrefix;
    }

    /** A protobuf message cursor: tag / wire type, varints, fixed32, length-delimited fields. */
    static final class Proto {
        private final byte[] data;
        private final int end;
        private int pos;
        int wire;

        Proto(byte[] data, int pos, int end) {
            this.data = data;
            this.pos = pos;
            this.end = end;
        }

        boolean more() {
            return pos < end;
        }

        int tag() {
            long key = varint();
            wire = (int) (key & 7);
            return (int) (key >>> 3);
        }

        long varint() {
            long v = 0;
            for (int shift = 0; shift < 64; shift += 7) {
                if (pos >= end) {
                    throw new IndexOutOfBoundsException("varint past the end");
                }
                int b = data[pos++] & 0xFF;
                v |= (long) (b & 0x7F) << shift;
                if (b < 0x80) {
                    return v;
                }
            }
            throw new IndexOutOfBoundsException("varint longer than 10 bytes");
        }

        float fixed32() {
            float f = ByteBuffer.wrap(data, pos, 4).order(ByteOrder.LITTLE_ENDIAN).getFloat();
            pos += 4;
            return f;
        }

        byte[] bytes() {
            int len = (int) varint();
            if (len < 0 || pos + len > end) {
                throw new IndexOutOfBoundsException("field of " + len + " B past the end");
            }
            byte[] out = java.util.Arrays.copyOfRange(data, pos, pos + len);
            pos += len;
            return out;
        }

        Proto message() {
            int len = (int) varint();
            if (len < 0 || pos + len > end) {
                throw new IndexOutOfBoundsException("message of " + len + " B past the end");
            }
            Proto p = new Proto(data, pos, pos + len);
            pos += len;
            return p;
        }

        void skip() {
            switch (wire) {
                case 0: varint(); break;
                case 1: pos += 8; break;
                case 2: bytes(); break;
                case 5: pos += 4; break;
                default: throw new IndexOutOfBoundsException("unknown wire type " + wire);
            }
            if (pos > end) {
                throw new IndexOutOfBoundsException("field past the end");
            }
        }
    }
}
