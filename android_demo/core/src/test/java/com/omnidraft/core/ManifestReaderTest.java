package com.omnidraft.core;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;
import static org.junit.Assert.fail;

import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import org.junit.Rule;
import org.junit.Test;
import org.junit.rules.TemporaryFolder;

public class ManifestReaderTest {
    @Rule
    public TemporaryFolder tmp = new TemporaryFolder();

    private static void write(File file, byte[] data) throws IOException {
        try (OutputStream out = new FileOutputStream(file)) {
            out.write(data);
        }
    }

    private static String graph(String file, int vocab) {
        return "{\"file\": \"" + file + "\", \"preset\": \"tiny\", \"family\": \"llama\", \"vocab_size\": "
                + vocab + ", \"max_seq_len\": 64, \"seq_len\": null, \"parity\": {\"tolerance\": 1e-05}}";
    }

    /** A bundle with two graph files and the golden n-gram cache, listed like the Python exporter does. */
    private File bundle(String extraFile) throws IOException {
        File dir = tmp.newFolder("bundle");
        write(new File(dir, "drafter.pte"), "drafter".getBytes(StandardCharsets.UTF_8));
        write(new File(dir, "target.pte"), "target!".getBytes(StandardCharsets.UTF_8));
        write(new File(dir, Bundle.NGRAM_FILE), NGramCacheFormatTest.goldenBytes());
        StringBuilder files = new StringBuilder();
        for (String name : new String[] {"drafter.pte", "target.pte", Bundle.NGRAM_FILE}) {
            File f = new File(dir, name);
            files.append(files.length() == 0 ? "" : ", ").append('"').append(name).append("\": {\"sha256\": \"")
                    .append(Files2.sha256Hex(f)).append("\", \"size\": ").append(f.length()).append(", \"role\": \"x\"}");
        }
        files.append(extraFile);
        String manifest = "{\"schema_version\": 1, \"format\": \"omnidraft-bundle\", \"backend\": \"xnnpack\", "
                + "\"draft_len\": 4, \"mapping_hash\": \"ab\", \"graphs\": {\"drafter\": " + graph("drafter.pte", 32000)
                + ", \"target\": " + graph("target.pte", 128256) + "}, \"files\": {" + files + "}, \"extras\": {}}";
        write(new File(dir, ManifestReader.MANIFEST_NAME), manifest.getBytes(StandardCharsets.UTF_8));
        return dir;
    }

    @Test
    public void verifiesAndLoadsTheNgramCache() throws IOException {
        Bundle b = Bundle.open(bundle(""));
        assertEquals("xnnpack", b.manifest.backend);
        assertEquals(128256, b.manifest.target.vocabSize);
        assertEquals(4, b.ngramCache.entries().size());
        assertTrue(b.summary(), b.summary().contains("n-gram cache: 4 entries, lfu"));
    }

    @Test
    public void rejectsATamperedFile() throws IOException {
        File dir = bundle("");
        write(new File(dir, "target.pte"), "target?".getBytes(StandardCharsets.UTF_8));
        expectError(dir, "target.pte: sha256 mismatch");
    }

    @Test
    public void rejectsMissingFilesAndEscapingPaths() throws IOException {
        expectError(bundle(", \"gone.bin\": {\"sha256\": \"00\", \"size\": 1, \"role\": \"x\"}"), "gone.bin: missing");
        tmp.delete();
        tmp.create();
        expectError(bundle(", \"../evil\": {\"sha256\": \"00\", \"size\": 1, \"role\": \"x\"}"), "escapes the bundle");
    }

    @Test
    public void rejectsNewerSchemaAndForeignJson() throws IOException {
        File dir = tmp.newFolder("b");
        File manifest = new File(dir, ManifestReader.MANIFEST_NAME);
        write(manifest, "{\"format\": \"omnidraft-bundle\", \"schema_version\": 2}".getBytes(StandardCharsets.UTF_8));
        expectError(dir, "schema_version 2 is newer");
        write(manifest, "{\"name\": \"something else\"}".getBytes(StandardCharsets.UTF_8));
        expectError(dir, "not an omnidraft bundle manifest");
        write(manifest, "{\"format\": \"omnidraft-bundle\", \"schema_version\": 1}".getBytes(StandardCharsets.UTF_8));
        expectError(dir, "malformed manifest (\"graphs\" missing or not an object)");
        expectError(tmp.newFolder("empty"), "manifest.json: missing");
    }

    private static void expectError(File dir, String message) {
        try {
            Bundle.open(dir);
            fail("accepted " + dir);
        } catch (IOException e) {
            assertTrue(e.getMessage(), e.getMessage().contains(message));
        }
    }
}
