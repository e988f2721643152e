package com.omnidraft.core;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.zip.CRC32;

/**
 * Reader and writer of the ODNG v1 n-gram cache format. The spec lives in the docstring of
 * omnidraft_deploy/ngram/format.py; this class implements it byte for byte.
 *
 * <pre>
 * "ODNG" | u16 version=1 | u16 flags (policy id, bits 4-15 zero) | u32 V_d | u32 V_t | u32 N | u32 B
 * | N x (u8 n, n x varint draft id, varint target id, varint uses) | u32 CRC-32 of all before it
 * </pre>
 */
public final class NGramCacheFormat {
    public static final int VERSION = 1;
    static final byte[] MAGIC = {'O', 'D', 'N', 'G'};
    static final int HEADER_SIZE = 24;
    static final int OVERHEAD = HEADER_SIZE + 4;

    private NGramCacheFormat() {}

    public static NGramCacheFile readFile(File file) throws IOException {
        if (!file.isFile()) {
            throw new NGramFormatException(file.getPath(), "missing");
        }
        return read(Files2.readAll(file), file.getPath());
    }

    public static NGramCacheFile read(byte[] data, String source) throws NGramFormatException {
        ByteBuffer buf = ByteBuffer.wrap(data).order(ByteOrder.LITTLE_ENDIAN);
        for (int i = 0; i < 4; i++) {
            if (data.length <= i || data[i] != MAGIC[i]) {
                throw new NGramFormatException(source, "not an n-gram cache (magic is not ODNG)");
            }
        }
        if (data.length < OVERHEAD) {
            throw new NGramFormatException(source, "truncated: " + data.length + " B is shorter than header + CRC");
        }
        int version = buf.getShort(4) & 0xFFFF;
        if (version != VERSION) {
            String how = version > VERSION ? "newer than" : "unknown to";
            throw new NGramFormatException(source, "format version " + version + " is " + how
                    + " this reader (" + VERSION + "); update the app or re-export the cache");
        }
        long sectionSize = u32(buf, 20);
        if (data.length != OVERHEAD + sectionSize) {
            throw new NGramFormatException(source, "size " + data.length + " B does not match the header ("
                    + (OVERHEAD + sectionSize) + " B): truncated or padded");
        }
        CRC32 crc = new CRC32();
        crc.update(data, 0, data.length - 4);
        if (crc.getValue() != u32(buf, data.length - 4)) {
            throw new NGramFormatException(source, "CRC-32 mismatch: the file is corrupted");
        }
        int flags = buf.getShort(6) & 0xFFFF;
        if (flags != NGramCacheFile.POLICY_LRU && flags != NGramCacheFile.POLICY_LFU) {
            throw new NGramFormatException(source, String.format("unknown flags 0x%04x (policy id or reserved bits)", flags));
        }
        long vd = u32(buf, 8);
        long vt = u32(buf, 12);
        if (vd == 0 || vt == 0 || vd > Integer.MAX_VALUE || vt > Integer.MAX_VALUE) {
            throw new NGramFormatException(source, "vocabulary sizes " + vd + " and " + vt + " outside [1, 2^31 - 1]");
        }
        List<NGramCacheFile.Entry> entries = readEntries(data, u32(buf, 16), (int) vd, (int) vt, source);
        return new NGramCacheFile(version, flags, (int) vd, (int) vt, entries);
    }

    private static List<NGramCacheFile.Entry> readEntries(byte[] data, long count, int vd, int vt, String source)
            throws NGramFormatException {
        Cursor c = new Cursor(data, HEADER_SIZE, data.length - 4, source);
        List<NGramCacheFile.Entry> entries = new ArrayList<>();
        Set<String> seen = new HashSet<>();
        for (long e = 0; e < count; e++) {
            c.entry = e;
            if (c.pos >= c.end) {
                throw c.fail("the entry section ends before N entries");
            }
            int n = data[c.pos++] & 0xFF;
            if (n < 2) {
                throw c.fail("n = " + n + ", an n-gram needs n >= 2");
            }
            int[] ids = new int[n];
            for (int i = 0; i < n; i++) {
                ids[i] = (int) c.idBelow(vd, "draft id", "drafter");
            }
            int target = (int) c.idBelow(vt, "target id", "target");
            long uses = c.varint();
            if (uses == 0) {
                throw c.fail("use count 0 (counts start at 1)");
            }
            if (!seen.add(Arrays.toString(ids))) {
                throw c.fail("duplicate n-gram " + Arrays.toString(ids));
            }
            entries.add(new NGramCacheFile.Entry(ids, target, uses));
        }
        if (c.pos != c.end) {
            throw new NGramFormatException(source, (c.end - c.pos) + " B left in the entry section after N entries");
        }
        return entries;
    }

    /** Encodes exactly what omnidraft_deploy.ngram.format.to_bytes writes for the same entries. */
    public static byte[] write(NGramCacheFile file) {
        ByteArrayOutputStream body = new ByteArrayOutputStream();
        for (NGramCacheFile.Entry e : file.entries()) {
            body.write(e.n());
            for (int id : e.draftIds()) {
                putVarint(body, id & 0xFFFFFFFFL);
            }
            putVarint(body, e.targetId & 0xFFFFFFFFL);
            putVarint(body, e.uses);
        }
        ByteBuffer out = ByteBuffer.allocate(OVERHEAD + body.size()).order(ByteOrder.LITTLE_ENDIAN);
        out.put(MAGIC).putShort((short) VERSION).putShort((short) file.policyId)
                .putInt(file.draftVocabSize).putInt(file.targetVocabSize)
                .putInt(file.entries().size()).putInt(body.size()).put(body.toByteArray());
        CRC32 crc = new CRC32();
        crc.update(out.array(), 0, out.position());
        out.putInt((int) crc.getValue());
        return out.array();
    }

    private static void putVarint(ByteArrayOutputStream out, long value) {
        while (value >= 0x80) {
            out.write((int) ((value & 0x7F) | 0x80));
            value >>>= 7;
        }
        out.write((int) value);
    }

    private static long u32(ByteBuffer buf, int offset) {
        return buf.getInt(offset) & 0xFFFFFFFFL;
    }

    /** Bounds-checked position inside the entry section. */
    private static final class Cursor {
        final byte[] data;
        final int end;
        final String source;
        int pos;
        long entry;

        Cursor(byte[] data, int pos, int end, String source) {
            this.data = data;
            this.pos = pos;
            this.end = end;
            this.source = source;
        }

        NGramFormatException fail(String problem) {
            return new NGramFormatException(source, "entry " + entry + ": " + problem);
        }

        long idBelow(int limit, String what, String vocab) throws NGramFormatException {
            long id = varint();
            if (id >= limit) {
                throw fail(what + " " + id + " outside the " + vocab + " vocabulary (" + limit + ")");
            }
            return id;
        }

        long varint() throws NGramFormatException {
            long value = 0;
            int shift = 0;
            int b;
            while (true) {
                if (pos >= end) {
                    throw fail("varint runs past the entry section");
                }
                b = data[pos++] & 0xFF;
                value |= (long) (b & 0x7F) << shift;
                if (b < 0x80) {
                    break;
                }
                shift += 7;
                if (shift >= 35) {
                    throw fail("varint longer than 5 bytes");
                }
            }
            if (shift > 0 && b == 0) {
                throw fail("non-canonical varint (ends with a 0x00 byte)");
            }
            if (value > 0xFFFFFFFFL) {
                throw fail("varint " + value + " does not fit in u32");
            }
            return value;
        }
    }
}
