package com.omnidraft.core;

import java.io.File;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.HashSet;
import java.util.Set;
import java.util.zip.CRC32;

/**
 * The vocabulary map (ODVM v1 and v2, spec in the docstring of omnidraft_deploy/vocab/io.py): the
 * only code of the core that knows both vocabularies. draft_to_target gives the direct mapping (DM)
 * of every drafter id (-1: none); the CSR table gives the canonical drafter spelling of every
 * target id. Readers refuse exactly what the Python reader refuses, with the same messages.
 */
public final class VocabMap {
    public static final int VERSION = 2;
    public static final long DEFAULT_MAX_BYTES = 256L << 20;
    public static final int ROLE_BOS = 1;
    public static final int ROLE_EOS = 2;
    public static final int ROLE_EOT = 3;
    public static final int ROLE_SOT = 4;
    public static final int ROLE_PLACEHOLDER = 5;
    private static final int HEADER_V1 = 24;
    private static final int HEADER_V2 = 32;

    public final int draftVocabSize;
    public final int targetVocabSize;
    private final int[] draftToTarget;
    private final int[] offsets;
    private final int[] flat;
    private final int[] draftEos;
    private final int[] targetEos;
    private final int[][] roles; // rows (role, drafter id, target id)
    private final boolean[] dmMask;

    private VocabMap(int[] d2t, int[] offsets, int[] flat, int[] draftEos, int[] targetEos, int[][] roles) {
        this.draftToTarget = d2t;
        this.offsets = offsets;
        this.flat = flat;
        this.draftEos = draftEos;
        this.targetEos = targetEos;
        this.roles = roles;
        this.draftVocabSize = d2t.length;
        this.targetVocabSize = offsets.length - 1;
        this.dmMask = new boolean[d2t.length];
        for (int i = 0; i < d2t.length; i++) {
            dmMask[i] = d2t[i] >= 0;
        }
    }

    public static VocabMap readFile(File file) throws IOException {
        if (!file.isFile()) {
            throw new FormatException(file.getPath(), "missing");
        }
        if (file.length() > DEFAULT_MAX_BYTES) {
            throw new FormatException(file.getPath(), file.length() + " B is over the size cap of "
                    + DEFAULT_MAX_BYTES + " B");
        }
        return read(Files2.readAll(file), file.getPath());
    }

    public static VocabMap read(byte[] data, String source) throws FormatException {
        ByteBuffer buf = ByteBuffer.wrap(data).order(ByteOrder.LITTLE_ENDIAN);
        if (data.length < HEADER_V1 + 4) {
            throw new FormatException(source, "truncated: " + data.length + " bytes is shorter than the header");
        }
        if (data[0] != 'O' || data[1] != 'D' || data[2] != 'V' || data[3] != 'M') {
            throw new FormatException(source, "not a vocabulary map (magic " + pyBytes(data, 4)
                    + ", expected b'ODVM')");
        }
        int version = buf.getShort(4) & 0xFFFF;
        if (version > VERSION) {
            throw new FormatException(source, "format version " + version + " is newer than this reader ("
                    + VERSION + ")");
        }
        if (version < 1) {
            throw new FormatException(source, "format version " + version + " does not exist (1.." + VERSION + ")");
        }
        int flags = buf.getShort(6) & 0xFFFF;
        if (flags != 0) {
            throw new FormatException(source, String.format("reserved flags are 0x%04x, must be 0", flags));
        }
        long vd = u32(buf, 8);
        long vt = u32(buf, 12);
        long n = u32(buf, 16);
        int nde = buf.getShort(20) & 0xFFFF;
        int nte = buf.getShort(22) & 0xFFFF;
        if (vd == 0 || vt == 0) {
            throw new FormatException(source, "empty vocabulary (drafter " + vd + ", target " + vt + " ids)");
        }
        int nRoles = 0;
        long nLost = 0;
        int head = HEADER_V1;
        if (version >= 2) {
            if (data.length < HEADER_V2 + 4) {
                throw new FormatException(source, "truncated: " + data.length + " bytes is shorter than the v2 header");
            }
            nRoles = buf.getShort(24) & 0xFFFF;
            int reserved = buf.getShort(26) & 0xFFFF;
            nLost = u32(buf, 28);
            head = HEADER_V2;
            if (reserved != 0) {
                throw new FormatException(source, "reserved header field is " + reserved + ", must be 0");
            }
        }
        long words = nde + nte + 3L * nRoles + 2 * nLost + vd + vt + 1 + n;
        long expected = head + 4 * words + 4;
        if (data.length != expected) {
            throw new FormatException(source, "size " + data.length + " B does not match header (" + expected
                    + " B): truncated or padded");
        }
        CRC32 crc = new CRC32();
        crc.update(data, 0, data.length - 4);
        if (crc.getValue() != u32(buf, data.length - 4)) {
            throw new FormatException(source, "CRC-32 mismatch: file is corrupted");
        }
        int[] pos = {head};
        int[] draftEos = ints(buf, pos, nde);
        int[] targetEos = ints(buf, pos, nte);
        int[] roleWords = ints(buf, pos, 3 * nRoles);
        int[] lost = ints(buf, pos, (int) (2 * nLost));
        int[] d2t = ints(buf, pos, (int) vd);
        int[] offsets = ints(buf, pos, (int) vt + 1);
        int[] flat = ints(buf, pos, (int) n);
        int[][] roles = new int[nRoles][];
        for (int i = 0; i < nRoles; i++) {
            roles[i] = new int[] {roleWords[3 * i], roleWords[3 * i + 1], roleWords[3 * i + 2]};
        }
        String problem = check((int) vd, (int) vt, n, draftEos, targetEos, roles, lost, d2t, offsets, flat);
        if (problem != null) {
            throw new FormatException(source, problem);
        }
        return new VocabMap(d2t, offsets, flat, draftEos, targetEos, roles);
    }

    private static String check(int vd, int vt, long n, int[] draftEos, int[] targetEos, int[][] roles,
                                int[] lost, int[] d2t, int[] offsets, int[] flat) {
        for (int e : draftEos) {
            if (e < 0 || e >= vd) {
                return "drafter EOS ids outside the drafter vocabulary";
            }
        }
        for (int e : targetEos) {
            if (e < 0 || e >= vt) {
                return "target EOS ids outside the target vocabulary";
            }
        }
        Set<Integer> codes = new HashSet<>();
        int[] placeholder = null;
        for (int[] r : roles) {
            if (r[0] < ROLE_BOS || r[0] > ROLE_PLACEHOLDER || !codes.add(r[0])) {
                return "role codes are unknown or repeated (known: [1, 2, 3, 4, 5])";
            }
            if (r[1] < -1 || r[1] >= vd || r[2] < -1 || r[2] >= vt) {
                return "role rows hold ids outside their vocabulary";
            }
            if (r[0] == ROLE_PLACEHOLDER) {
                placeholder = r;
            }
        }
        if (placeholder != null && (placeholder[1] < 0 || placeholder[2] != -1)) {
            return "the placeholder role row needs a drafter id and target id -1";
        }
        for (int i = 0; i < lost.length; i += 2) {
            boolean unsorted = i > 0 && Integer.compareUnsigned(lost[i], lost[i - 2]) <= 0;
            if (placeholder == null || unsorted || Integer.compareUnsigned(lost[i], vt) >= 0
                    || Integer.compareUnsigned(lost[i + 1], 1) < 0) {
                return "placeholder rows are unsorted, out of range, empty or lack a placeholder role";
            }
        }
        for (int t : d2t) {
            if (t >= vt || t < -1) {
                return "draft_to_target holds ids outside the target vocabulary";
            }
        }
        boolean monotone = offsets[0] == 0 && (offsets[offsets.length - 1] & 0xFFFFFFFFL) == n;
        for (int i = 1; i < offsets.length && monotone; i++) {
            monotone = Integer.compareUnsigned(offsets[i], offsets[i - 1]) >= 0;
        }
        if (!monotone) {
            return "target_to_draft_offsets do not start at 0, are not monotone or do not end at N";
        }
        for (int d : flat) {
            if (Integer.compareUnsigned(d, vd) >= 0) {
                return "target_to_draft_flat holds ids outside the drafter vocabulary";
            }
        }
        return null;
    }

    /** Python's repr of the first n bytes (b'..'), so that both readers print the same message. */
    static String pyBytes(byte[] data, int n) {
        StringBuilder out = new StringBuilder("b'");
        for (int i = 0; i < n; i++) {
            int b = data[i] & 0xFF;
            if (b == '\\' || b == '\'') {
                out.append('\\').append((char) b);
            } else if (b == '\t') {
                out.append("\\t");
            } else if (b == '\n') {
                out.append("\\n");
            } else if (b == '\r') {
                out.append("\\r");
            } else if (b >= 0x20 && b < 0x7F) {
                out.append((char) b);
            } else {
                out.append(String.format("\\x%02x", b));
            }
        }
        return out.append('\'').toString();
    }

    private static int[] ints(ByteBuffer buf, int[] pos, int count) {
        int[] out = new int[count];
        for (int i = 0; i < count; i++) {
            out[i] = buf.getInt(pos[0] + 4 * i);
        }
        pos[0] += 4 * count;
        return out;
    }

    private static long u32(ByteBuffer buf, int offset) {
        return buf.getInt(offset) & 0xFFFFFFFFL;
    }

    /** Direct mapping of a drafter id: the target id with the same bytes, or -1. */
    public int draftToTarget(int draftId) {
        return draftToTarget[draftId];
    }

    /** Whether a drafter id maps directly (the DM mask that exact mode restricts the drafter to). */
    public boolean isDirect(int draftId) {
        return dmMask[draftId];
    }

    /** Canonical drafter spelling of one target id. */
    public int[] targetToDraft(int targetId) {
        if (targetId < 0 || targetId >= targetVocabSize) {
            throw new IllegalArgumentException("target id " + targetId + " is outside the target vocabulary (0.."
                    + (targetVocabSize - 1) + "; model rows past it are padding)");
        }
        int[] out = new int[offsets[targetId + 1] - offsets[targetId]];
        System.arraycopy(flat, offsets[targetId], out, 0, out.length);
        return out;
    }

    /** Drafter ids spelling the same bytes as the target ids. */
    public IntList translate(int[] targetIds) {
        IntList out = new IntList();
        for (int t : targetIds) {
            out.addAll(targetToDraft(t));
        }
        return out;
    }

    public int[] draftEos() {
        return draftEos.clone();
    }

    public int[] targetEos() {
        return targetEos.clone();
    }

    public boolean isDraftEos(int draftId) {
        for (int e : draftEos) {
            if (e == draftId) {
                return true;
            }
        }
        return false;
    }

    /** The id of a role on one side (side 1 drafter, 2 target); -1 when absent. */
    public int roleId(int role, int side) {
        for (int[] r : roles) {
            if (r[0] == role && r[side] >= 0) {
                return r[side];
            }
        }
        return -1;
    }

    /** The id the drafter's context starts with (v2 maps), -1 when none. */
    public int drafterBos() {
        return roleId(ROLE_BOS, 1);
    }
}
