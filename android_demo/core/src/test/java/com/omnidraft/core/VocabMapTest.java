package com.omnidraft.core;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.fail;

import java.io.File;
import java.io.IOException;
import java.util.Arrays;
import org.junit.Test;

public class VocabMapTest {
    /** tests/golden/mapper_v1.bin, written by the Python writer (version 1, still read). */
    static byte[] golden() throws IOException {
        File ngram = new File(System.getProperty("omnidraft.golden", "../../tests/golden/ngram_v1.bin"));
        return Files2.readAll(new File(ngram.getParentFile(), "mapper_v1.bin"));
    }

    @Test
    public void readsTheGoldenVersion1Map() throws IOException {
        VocabMap m = VocabMap.read(golden(), "mapper_v1.bin");
        assertEquals(6, m.draftVocabSize);
        assertEquals(10, m.targetVocabSize);
        assertEquals(-1, m.drafterBos());
        assertArrayEquals(new int[] {0}, m.draftEos());
        assertEquals(0, m.draftToTarget(0)); // drafter EOS -> target EOS
    }

    private static void refused(byte[] data, String message) {
        try {
            VocabMap.read(data, "S");
            fail("accepted a broken map; expected " + message);
        } catch (FormatException e) {
            assertEquals("S: " + message, e.getMessage());
        }
    }

    @Test
    public void refusesBrokenFilesWithPythonsMessages() throws IOException {
        byte[] good = golden();
        byte[] magic = good.clone();
        magic[0] ^= 1;
        refused(magic, "not a vocabulary map (magic b'NDVM', expected b'ODVM')");
        byte[] version = good.clone();
        version[4] ^= 5;
        refused(version, "format version 4 is newer than this reader (2)");
        refused(Arrays.copyOf(good, good.length - 1), "size " + (good.length - 1) + " B does not match header ("
                + good.length + " B): truncated or padded");
        refused(Arrays.copyOf(good, 10), "truncated: 10 bytes is shorter than the header");
        byte[] crc = good.clone();
        crc[30] ^= 1;
        refused(crc, "CRC-32 mismatch: file is corrupted");
    }
}
