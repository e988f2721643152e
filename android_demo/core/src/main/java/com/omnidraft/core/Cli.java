package com.omnidraft.core;

import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.OutputStream;

/**
 * Command line used by tests/e2e/test_android_java.py: {@code dump FILE}, {@code rewrite IN OUT},
 * {@code verify BUNDLE_DIR [TARGET]}, {@code vocabmap FILE}, {@code encode TOKENIZER_DIR TEXT}. Errors print the message to stderr and exit with status 1.
 */
public final class Cli {
    private Cli() {}

    public static void main(String[] args) {
        try {
            run(args);
        } catch (IOException | IllegalArgumentException e) {
            System.err.println("error: " + e.getMessage());
            System.exit(1);
        }
    }

    private static void run(String[] args) throws IOException {
        String verb = args.length > 0 ? args[0] : "";
        if (verb.equals("dump") && args.length == 2) {
            NGramCacheFile f = NGramCacheFormat.readFile(new File(args[1]));
            System.out.println("version=" + f.version + " policy=" + f.policyName() + " draft_vocab="
                    + f.draftVocabSize + " target_vocab=" + f.targetVocabSize + " entries=" + f.entries().size());
            for (NGramCacheFile.Entry e : f.entries()) {
                StringBuilder line = new StringBuilder();
                for (int id : e.draftIds()) {
                    line.append(id).append(' ');
                }
                System.out.println(line.append("-> ").append(e.targetId).append(" x").append(e.uses));
            }
        } else if (verb.equals("rewrite") && args.length == 3) {
            byte[] data = NGramCacheFormat.write(NGramCacheFormat.readFile(new File(args[1])));
            try (OutputStream out = new FileOutputStream(args[2])) {
                out.write(data);
            }
        } else if (verb.equals("verify") && (args.length == 2 || args.length == 3)) {
            System.out.println(Bundle.open(new File(args[1]), args.length == 3 ? args[2] : null).summary());
        } else if (verb.equals("vocabmap") && args.length == 2) {
            VocabMap m = VocabMap.readFile(new File(args[1]));
            System.out.println("drafter_vocab=" + m.draftVocabSize + " target_vocab=" + m.targetVocabSize
                    + " drafter_bos=" + m.drafterBos() + " draft_eos=" + java.util.Arrays.toString(m.draftEos())
                    + " target_eos=" + java.util.Arrays.toString(m.targetEos()));
        } else if (verb.equals("encode") && args.length == 3) {
            System.out.println(java.util.Arrays.toString(Tokenizer.load(new File(args[1])).encode(args[2])));
        } else {
            throw new IllegalArgumentException("usage: dump FILE | rewrite IN OUT | verify BUNDLE_DIR [TARGET] | vocabmap FILE | encode TOKENIZER_DIR TEXT");
        }
    }
}
