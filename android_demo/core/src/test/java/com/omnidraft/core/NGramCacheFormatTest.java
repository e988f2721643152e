package com.omnidraft.core;

import static org.junit.Assert.assertArrayEquals;
import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import java.io.File;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import org.junit.Test;

public class NGramCacheFormatTest {
    /** tests/golden/ngram_v1.bin, written by the Python writer (see tests/core/test_ngram_format.py). */
    static File golden() {
        return new File(System.getProperty("omnidraft.golden", "../../tests/golden/ngram_v1.bin"));
    }

    static byte[] goldenBytes() throws IOException {
        return Files2.readAll(golden());
    }

    @Test
    public void goldenFileHasTheExpectedEntries() throws IOException {
        NGramCacheFile f = NGramCacheFormat.readFile(golden());
        assertEquals(1, f.version);
        assertEquals("lfu", f.policyName());
        assertEquals(32000, f.draftVocabSize);
        assertEquals(128256, f.targetVocabSize);
        List<NGramCacheFile.Entry> e = f.entries();
        assertEquals(4, e.size());
        assertArrayEquals(new int[] {29871, 30010, 29879}, e.get(0).draftIds());
        assertEquals(596, e.get(0).targetId);
        assertEquals(1, e.get(0).uses);
        assertArrayEquals(new int[] {100, 200, 300, 400}, e.get(1).draftIds());
        assertEquals(127999, e.get(1).targetId);
        assertArrayEquals(new int[] {1, 2}, e.get(2).draftIds());
        assertEquals(6, e.get(2).targetId);
        assertEquals(2, e.get(2).uses);
        assertArrayEquals(new int[] {13, 13}, e.get(3).draftIds());
        assertEquals(271, e.get(3).targetId);
        assertEquals(3, e.get(3).uses);
    }

    @Test
    public void writerReproducesTheGoldenBytes() throws IOException {
        byte[] data = goldenBytes();
        assertArrayEquals(data, NGramCacheFormat.write(NGramCacheFormat.read(data, "golden")));
    }

    @Test
    public void roundTripOfLargeIdsAndCounts() throws IOException {
        List<NGramCacheFile.Entry> entries = new ArrayList<>();
        entries.add(new NGramCacheFile.Entry(new int[] {0, Integer.MAX_VALUE - 1}, 127, 0xFFFFFFFFL));
        entries.add(new NGramCacheFile.Entry(new int[] {128, 16383, 16384}, 0, 1));
        NGramCacheFile f = new NGramCacheFile(1, NGramCacheFile.POLICY_LRU, Integer.MAX_VALUE, 128, entries);
        NGramCacheFile back = NGramCacheFormat.read(NGramCacheFormat.write(f), "mem");
        assertEquals(2, back.entries().size());
        assertArrayEquals(new int[] {0, Integer.MAX_VALUE - 1}, back.entries().get(0).draftIds());
        assertEquals(0xFFFFFFFFL, back.entries().get(0).uses);
        assertArrayEquals(new int[] {128, 16383, 16384}, back.entries().get(1).draftIds());
    }

    @Test
    public void everyTruncationAndSingleByteCorruptionIsRejected() throws IOException {
        byte[] data = goldenBytes();
        for (int k = 0; k < data.length; k++) {
            expectError(java.util.Arrays.copyOf(data, k), "");
        }
        for (int pos = 0; pos < data.length; pos++) {
            for (int xor = 1; xor < 256; xor++) {
                byte[] bad = data.clone();
                bad[pos] ^= (byte) xor;
                expectError(bad, "");
            }
        }
    }

    @Test
    public void errorsNameTheFileAndTheProblem() throws IOException {
        byte[] data = goldenBytes();
        byte[] foreign = data.clone();
        foreign[0] = 'P';
        expectError(foreign, "bundle/ngram_cache.bin: not an n-gram cache");
        byte[] newer = data.clone();
        newer[4] = 2;
        expectError(newer, "format version 2 is newer than this reader");
        byte[] corrupt = data.clone();
        corrupt[30] ^= 1;
        expectError(corrupt, "CRC-32 mismatch");
        expectError(java.util.Arrays.copyOf(data, data.length - 1), "truncated or padded");
    }

    private static void expectError(byte[] data, String message) {
        try {
            NGramCacheFormat.read(data, "bundle/ngram_cache.bin");
            fail("accepted a bad file of " + data.length + " bytes");
        } catch (NGramFormatException e) {
            assertTrue(e.getMessage(), e.getMessage().contains(message));
        }
    }
}
