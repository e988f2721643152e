package com.omnidraft.core;

import java.io.ByteArrayOutputStream;

/**
 * Streaming detokenisation: target ids -> UTF-8 text as tokens arrive. Bytes of an incomplete
 * multi-byte character are held back until its last byte arrives; invalid sequences become one
 * U+FFFD per maximal subpart (as Python's errors="replace" and Rust's from_utf8_lossy), so the
 * concatenated output equals decoding all ids at once. Special tokens are dropped; SentencePiece
 * tokenizers drop the leading space of the text (the dummy prefix), as their decode does.
 */
public final class TextStream {
    private final Tokenizer tokenizer;
    private final ByteArrayOutputStream pending = new ByteArrayOutputStream();
    private boolean atStart = true;

    public TextStream(Tokenizer tokenizer) {
        this.tokenizer = tokenizer;
    }

    /** The text that the new ids complete (possibly empty). */
    public String push(int[] ids) {
        for (int id : ids) {
            if (tokenizer.isSpecial(id)) {
                continue;
            }
            byte[] b = tokenizer.tokenBytes(id);
            int from = 0;
            if (atStart && tokenizer.stripsLeadingSpace() && b.length > 0 && b[0] == ' ') {
                from = 1;
            }
            atStart &= b.length == 0;
            pending.write(b, from, b.length - from);
        }
        return drain(false);
    }

    /** Whatever is still held back (an incomplete sequence at the very end becomes U+FFFD). */
    public String finish() {
        return drain(true);
    }

    private String drain(boolean last) {
        byte[] data = pending.toByteArray();
        StringBuilder out = new StringBuilder();
        int used = decode(data, last, out);
        pending.reset();
        pending.write(data, used, data.length - used);
        return out.toString();
    }

    /** Decodes data into out; returns the bytes consumed (all unless an incomplete tail is held). */
    static int decode(byte[] data, boolean last, StringBuilder out) {
        int i = 0;
        while (i < data.length) {
            int b0 = data[i] & 0xFF;
            if (b0 < 0x80) {
                out.append((char) b0);
                i++;
                continue;
            }
            int need;
            int lo = 0x80;
            int hi = 0xBF;
            if (b0 >= 0xC2 && b0 <= 0xDF) {
                need = 1;
            } else if (b0 >= 0xE0 && b0 <= 0xEF) {
                need = 2;
                lo = b0 == 0xE0 ? 0xA0 : 0x80;
                hi = b0 == 0xED ? 0x9F : 0xBF;
            } else if (b0 >= 0xF0 && b0 <= 0xF4) {
                need = 3;
                lo = b0 == 0xF0 ? 0x90 : 0x80;
                hi = b0 == 0xF4 ? 0x8F : 0xBF;
            } else {
                out.append('\uFFFD');
                i++;
                continue;
            }
            int cp = b0 & (0x3F >> need);
            int j = i + 1;
            boolean bad = false;
            for (int k = 0; k < need; k++, j++) {
                if (j >= data.length) {
                    if (!last) {
                        return i; // hold the incomplete character back
                    }
                    bad = true;
                    break;
                }
                int c = data[j] & 0xFF;
                if (c < (k == 0 ? lo : 0x80) || c > (k == 0 ? hi : 0xBF)) {
                    bad = true;
                    break;
                }
                cp = (cp << 6) | (c & 0x3F);
            }
            if (bad) {
                out.append('\uFFFD');
                i = j;
                continue;
            }
            out.appendCodePoint(cp);
            i = j;
        }
        return i;
    }
}
