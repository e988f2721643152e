package com.omnidraft.core;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;

import java.io.File;
import java.io.IOException;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import org.junit.Assume;
import org.junit.Test;

/**
 * tests/golden/tokenizer_vectors/NAME.json.gz (written by python -m omnidraft_deploy.golden): the
 * Java tokenizers must give exactly the ids the Python tokenizers gave, for every string. The
 * tokenizer files come from -Domnidraft.tokenizers=DIR (DIR/NAME/tokenizer.json or .model, what a
 * bundle ships); vectors whose tokenizer folder is absent are reported as skipped.
 */
public class TokenizerVectorsTest {
    @Test
    public void everyVectorMatches() throws IOException {
        File vectors = Golden.dir("omnidraft.vectors");
        File tokenizers = Golden.dir("omnidraft.tokenizers");
        Assume.assumeTrue("set -Domnidraft.vectors and -Domnidraft.tokenizers", vectors != null && tokenizers != null);
        File[] files = vectors.listFiles((d, n) -> n.endsWith(".json.gz"));
        assertTrue("no vector files in " + vectors, files != null && files.length > 0);
        Arrays.sort(files);
        for (File f : files) {
            String name = f.getName().replace(".json.gz", "");
            Tokenizer tok = Golden.tokenizer(name);
            if (tok == null) {
                System.out.println("tokenizer vectors " + name + ": skipped (no tokenizer files)");
                continue;
            }
            Map<String, Object> doc = Golden.json(f);
            List<Object> strings = ByteLevelBpe.asList(doc.get("strings"), "strings");
            List<Object> ids = ByteLevelBpe.asList(doc.get("ids"), "ids");
            assertEquals(strings.size(), ids.size());
            StringBuilder bad = new StringBuilder();
            int nBad = 0;
            for (int i = 0; i < strings.size(); i++) {
                String s = (String) strings.get(i);
                int[] expected = Golden.ints(ids.get(i));
                int[] actual = tok.encode(s);
                if (!Arrays.equals(expected, actual)) {
                    if (nBad++ < 5) {
                        bad.append("\n  ").append(MiniJsonQuote.quote(s)).append(": python ")
                                .append(Arrays.toString(expected)).append(" java ").append(Arrays.toString(actual));
                    }
                }
            }
            assertEquals(name + ": " + nBad + " of " + strings.size() + " strings differ:" + bad, 0, nBad);
            System.out.println("tokenizer vectors " + name + ": " + strings.size() + " strings OK");
        }
    }
}
