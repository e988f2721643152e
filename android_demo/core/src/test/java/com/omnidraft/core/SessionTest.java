package com.omnidraft.core;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNotNull;
import static org.junit.Assert.assertNull;
import static org.junit.Assert.assertTrue;

import java.io.File;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import org.junit.Assume;
import org.junit.Test;

/**
 * The app's Session drafts as `omnidraft run` does: cost-aware with lookups when its session folder
 * holds a cost_profile.json, else +2/-1; a malformed profile is refused naming the file. Opens the
 * tests' multi-target bundle (-Domnidraft.multibundle) with stand-in models (the core needs no
 * runtime): each row's argmax is (input id * 7 + 3) mod 1000.
 */
public class SessionTest {
    private static final String TARGET = "tiny-llama3-8b";
    private static final String PROFILE = "{\"target_ms\": [31.5, 34.5, 33.7, 35.7, 38.9], \"drafter_ms\": [5.7],"
            + " \"lookup_ms\": 0.001, \"overhead_ms\": 2.9, \"fingerprint\": \"test\"}";

    private static CausalLm standIn(BundleManifest.Graph info) {
        return new CausalLm() {
            @Override
            public float[][] forward(int[] ids, int startPos) {
                float[][] rows = new float[ids.length][info.vocabSize];
                for (int i = 0; i < ids.length; i++) {
                    rows[i][(int) ((ids[i] * 7L + 3) % 1000)] = 1f;
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
        };
    }

    private static Session open(File bundle, File state) throws IOException {
        return new Session(bundle, TARGET, state, (file, info, m) -> standIn(info), 12);
    }

    @Test
    public void theCostProfileInTheSessionFolderSelectsTheRuntimesDrafting() throws IOException {
        File bundle = Golden.dir("omnidraft.multibundle");
        Assume.assumeTrue("set -Domnidraft.multibundle", bundle != null);
        File state = Files.createTempDirectory("session").toFile();
        Session plain = open(bundle, state);
        assertNull(plain.profile);
        assertTrue(plain.decoder().proposer() instanceof CrossVocabDrafter);
        assertTrue(plain.drafting(), plain.drafting().startsWith("drafting: +2/-1"));
        assertEquals(12, plain.generate("def f(x):", (text, s) -> { }).generated);

        File folder = new File(new File(state, "targets"), TARGET); // the target's session folder
        Files.write(new File(folder, CostProfile.FILE).toPath(), PROFILE.getBytes(StandardCharsets.UTF_8));
        Session costed = open(bundle, state);
        assertNotNull(costed.profile);
        assertEquals(31.5, costed.profile.valueMs(), 0.0);
        assertTrue(costed.drafting(), costed.drafting().startsWith("drafting: cost-aware up to 6 tokens + lookup"));
        assertTrue(costed.decoder().proposer() instanceof HybridProposer);
        assertEquals(12, costed.generate("def f(x):", (text, s) -> { }).generated);

        Files.write(new File(folder, CostProfile.FILE).toPath(), "{\"target_ms\": []}".getBytes(StandardCharsets.UTF_8));
        try {
            open(bundle, state);
            throw new AssertionError("a malformed cost profile was accepted");
        } catch (FormatException e) {
            assertTrue(e.getMessage(), e.getMessage().startsWith(new File(folder, CostProfile.FILE).getPath()
                    + ": not a cost profile (a cost profile needs the target's 1-token latency at least)"));
        }
        System.out.println("session: " + plain.drafting() + "; with the profile, " + costed.drafting());
    }
}
