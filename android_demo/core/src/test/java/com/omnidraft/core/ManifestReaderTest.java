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
        write(manifest, "{\"format\": \"omnidraft-bundle\", \"schema_version\": 3}".getBytes(StandardCharsets.UTF_8));
        expectError(dir, "schema_version 3 is newer");
        write(manifest, "{\"name\": \"something else\"}".getBytes(StandardCharsets.UTF_8));
        expectError(dir, "not an omnidraft bundle manifest");
        write(manifest, "{\"format\": \"omnidraft-bundle\", \"schema_version\": 1}".getBytes(StandardCharsets.UTF_8));
        expectError(dir, "malformed manifest (\"graphs\" missing or not an object)");
        expectError(tmp.newFolder("empty"), "manifest.json: missing");
    }

    /** Lists {@code rels} (each file under dir) with their real sha256 and size, role by prefix. */
    private static String listing(File dir, String... rels) throws IOException {
        StringBuilder files = new StringBuilder();
        for (String rel : rels) {
            File f = new File(dir, rel);
            String role = rel.startsWith("drafter") ? "drafter_graph" : rel.endsWith("target.onnx") ? "target_graph"
                    : rel.startsWith("maps/") ? "vocab_map" : rel.endsWith(Bundle.NGRAM_FILE) ? "ngram_cache" : "expected";
            files.append(files.length() == 0 ? "" : ", ").append('"').append(rel).append("\": {\"sha256\": \"")
                    .append(Files2.sha256Hex(f)).append("\", \"size\": ").append(f.length()).append(", \"role\": \"")
                    .append(role).append("\"}");
        }
        return files.toString();
    }

    private static String target(String name, int vocab, String map) {
        String dir = "targets/" + name + "/";
        return "\"" + name + "\": {\"graph\": " + graph(dir + "target.onnx", vocab) + ", \"mapping_hash\": \""
                + name + "-hash\", \"vocab_map\": \"" + map + "\", \"ngram_cache\": \"" + dir + Bundle.NGRAM_FILE
                + "\", \"tokenizer\": \"" + dir + "target_tokenizer\", \"expected\": \"" + dir + "expected.json\"}";
    }

    /** A schema 2 bundle: one drafter, targets a (vocab 128256) and b (151936), each its own map and cache. */
    private File multiBundle(String schema) throws IOException {
        File dir = tmp.newFolder("multi");
        new File(dir, "maps").mkdirs();
        write(new File(dir, "drafter.onnx"), "drafter".getBytes(StandardCharsets.UTF_8));
        write(new File(dir, "maps/aaaa.bin"), "map a".getBytes(StandardCharsets.UTF_8));
        write(new File(dir, "maps/bbbb.bin"), "map b".getBytes(StandardCharsets.UTF_8));
        StringBuilder rels = new StringBuilder("drafter.onnx maps/aaaa.bin maps/bbbb.bin");
        for (String name : new String[] {"a", "b"}) {
            File t = new File(dir, "targets/" + name);
            t.mkdirs();
            write(new File(t, "target.onnx"), ("target " + name).getBytes(StandardCharsets.UTF_8));
            write(new File(t, "expected.json"), "{}".getBytes(StandardCharsets.UTF_8));
            byte[] cache = name.equals("a") ? NGramCacheFormatTest.goldenBytes()
                    : NGramCacheFormat.write(new NGramCacheFile(NGramCacheFormat.VERSION, NGramCacheFile.POLICY_LRU,
                            32000, 151936, new java.util.ArrayList<>()));
            write(new File(t, Bundle.NGRAM_FILE), cache);
            rels.append(" targets/").append(name).append("/target.onnx targets/").append(name)
                    .append("/expected.json targets/").append(name).append('/').append(Bundle.NGRAM_FILE);
        }
        String manifest = "{\"schema_version\": " + schema + ", \"format\": \"omnidraft-bundle\", \"backend\": \"onnx\", "
                + "\"draft_len\": 3, \"mapping_hash\": \"ab\", \"graphs\": {\"drafter\": " + graph("drafter.onnx", 32000)
                + "}, \"targets\": {" + target("a", 128256, "maps/aaaa.bin") + ", " + target("b", 151936, "maps/bbbb.bin")
                + "}, \"files\": {" + listing(dir, rels.toString().split(" ")) + "}, \"extras\": {}}";
        write(new File(dir, ManifestReader.MANIFEST_NAME), manifest.getBytes(StandardCharsets.UTF_8));
        return dir;
    }

    @Test
    public void opensEachTargetOfAMultiTargetBundleByName() throws IOException {
        File dir = multiBundle("2");
        for (String name : new String[] {"a", "b"}) {
            Bundle b = Bundle.open(dir, name);
            assertEquals(name, b.targetName);
            assertEquals(java.util.List.of("a", "b"), b.targetNames);
            assertEquals("targets/" + name + "/target.onnx", b.manifest.target.file);
            assertEquals(name.equals("a") ? 128256 : 151936, b.manifest.target.vocabSize);
            assertEquals(name + "-hash", b.manifest.mappingHash);
            assertEquals(name.equals("a") ? "maps/aaaa.bin" : "maps/bbbb.bin", b.manifest.parts().vocabMap);
            assertEquals("targets/" + name + "/target_tokenizer", b.manifest.parts().tokenizer);
            assertEquals(name.equals("a") ? 4 : 0, b.ngramCache.entries().size());
            assertEquals("drafter.onnx", b.manifest.drafter.file); // one drafter for both
            assertTrue(b.summary(), b.summary().contains("target " + name + " of 2: a, b"));
        }
    }

    @Test
    public void aMultiTargetBundleNeedsATargetNameAndListsThem() throws IOException {
        File dir = multiBundle("2");
        expectError(dir, null, "a bundle of 2 targets (a, b): choose one by name");
        expectError(dir, "c", "no target 'c' in this bundle; its targets: a, b");
        write(new File(dir, "targets/b/expected.json"), "[]".getBytes(StandardCharsets.UTF_8));
        expectError(dir, "a", "targets/b/expected.json: sha256 mismatch"); // every target is verified
    }

    @Test
    public void singleTargetBundlesOpenByTheirPresetToo() throws IOException {
        File dir = bundle("");
        assertEquals("tiny", Bundle.open(dir, "tiny").targetName);
        assertEquals(BundleManifest.VOCAB_MAP, Bundle.open(dir).manifest.parts().vocabMap);
        expectError(dir, "other", "no target 'other' in this bundle; its targets: tiny");
    }

    @Test
    public void mixedSchemasAreRefused() throws IOException {
        expectError(multiBundle("1"), null, "\"targets\": 2 to 64 targets in a schema 2 manifest, got 2 in schema 1");
        tmp.delete();
        tmp.create();
        File dir = multiBundle("2");
        File manifest = new File(dir, ManifestReader.MANIFEST_NAME);
        String text = new String(Files2.readAll(manifest), StandardCharsets.UTF_8);
        write(manifest, text.replace("\"targets/a/target_tokenizer\"", "\"../a\"").getBytes(StandardCharsets.UTF_8));
        expectError(dir, "a", "target a has its tokenizer in targets/a/target_tokenizer, not ../a");
        String schema1 = text.replace("\"schema_version\": 2", "\"schema_version\": 1");
        write(manifest, schema1.replace(", \"targets\": {", ", \"t\": {").getBytes(StandardCharsets.UTF_8));
        expectError(dir, "a", "\"graphs\" holds the drafter and, in a schema 1 manifest only, the target");
        write(manifest, text.replace(", \"targets\": {", ", \"t\": {").getBytes(StandardCharsets.UTF_8));
        expectError(dir, "a", "\"targets\" missing from a schema 2 manifest");
    }

    private static void expectError(File dir, String message) {
        expectError(dir, null, message);
    }

    private static void expectError(File dir, String target, String message) {
        try {
            Bundle.open(dir, target);
            fail("accepted " + dir);
        } catch (IOException e) {
            assertTrue(e.getMessage(), e.getMessage().contains(message));
        }
    }
}
