package com.omnidraft.core;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The pre-tokenizers of the shipped tokenizer.json files: Split (regex, behaviour Isolated),
 * Digits, ByteLevel (GPT-2 regex when use_regex) and Sequence. Regexes run with
 * UNICODE_CHARACTER_CLASS so that \s, \p{L} and \p{N} have their Unicode meaning, as in Rust.
 */
abstract class PreTokenizer {
    static final String GPT2_REGEX =
            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

    abstract List<String> apply(List<String> pieces);

    static List<PreTokenizer> parse(Object spec, String source) throws FormatException {
        List<PreTokenizer> out = new ArrayList<>();
        if (spec != null) {
            add(ByteLevelBpe.asMap(spec, "pre_tokenizer"), out, source);
        }
        return out;
    }

    private static void add(Map<String, Object> spec, List<PreTokenizer> out, String source) throws FormatException {
        Object type = spec.get("type");
        if ("Sequence".equals(type)) {
            for (Object p : ByteLevelBpe.asList(spec.get("pretokenizers"), "pretokenizers")) {
                add(ByteLevelBpe.asMap(p, "pre-tokenizer"), out, source);
            }
        } else if ("Split".equals(type)) {
            Map<String, Object> pattern = ByteLevelBpe.asMap(spec.get("pattern"), "Split.pattern");
            if (!"Isolated".equals(spec.get("behavior")) || Boolean.TRUE.equals(spec.get("invert"))) {
                throw new FormatException(source, "Split behaviour " + spec.get("behavior") + " (invert "
                        + spec.get("invert") + ") is not supported (Isolated only)");
            }
            String regex = pattern.containsKey("Regex") ? (String) pattern.get("Regex")
                    : Pattern.quote((String) pattern.get("String"));
            out.add(new RegexSplit(regex));
        } else if ("Digits".equals(type)) {
            out.add(new Digits(Boolean.TRUE.equals(spec.get("individual_digits"))));
        } else if ("ByteLevel".equals(type)) {
            if (Boolean.TRUE.equals(spec.get("add_prefix_space"))) {
                out.add(new PrefixSpace());
            }
            if (!Boolean.FALSE.equals(spec.get("use_regex"))) {
                out.add(new RegexSplit(GPT2_REGEX));
            }
        } else {
            throw new FormatException(source, "pre-tokenizer " + type + " is not supported");
        }
    }

    /** Matches and the text between them become pieces (behaviour Isolated). */
    static final class RegexSplit extends PreTokenizer {
        private final Pattern pattern;

        RegexSplit(String regex) {
            pattern = Pattern.compile(regex, Pattern.UNICODE_CHARACTER_CLASS);
        }

        @Override
        List<String> apply(List<String> pieces) {
            List<String> out = new ArrayList<>();
            for (String piece : pieces) {
                Matcher m = pattern.matcher(piece);
                int last = 0;
                while (m.find()) {
                    if (m.start() > last) {
                        out.add(piece.substring(last, m.start()));
                    }
                    if (m.end() > m.start()) {
                        out.add(m.group());
                    }
                    last = m.end();
                }
                if (last < piece.length()) {
                    out.add(piece.substring(last));
                }
            }
            return out;
        }
    }

    /** Numeric characters (Rust char::is_numeric) split out, one by one or as runs. */
    static final class Digits extends PreTokenizer {
        private final boolean individual;

        Digits(boolean individual) {
            this.individual = individual;
        }

        private static boolean numeric(int cp) {
            int t = Character.getType(cp);
            return t == Character.DECIMAL_DIGIT_NUMBER || t == Character.LETTER_NUMBER || t == Character.OTHER_NUMBER;
        }

        @Override
        List<String> apply(List<String> pieces) {
            List<String> out = new ArrayList<>();
            for (String piece : pieces) {
                int start = 0;
                int i = 0;
                while (i < piece.length()) {
                    int cp = piece.codePointAt(i);
                    int next = i + Character.charCount(cp);
                    if (numeric(cp)) {
                        if (i > start) {
                            out.add(piece.substring(start, i));
                        }
                        int end = next;
                        while (!individual && end < piece.length() && numeric(piece.codePointAt(end))) {
                            end += Character.charCount(piece.codePointAt(end));
                        }
                        out.add(piece.substring(i, end));
                        start = end;
                        next = end;
                    }
                    i = next;
                }
                if (start < piece.length()) {
                    out.add(piece.substring(start));
                }
            }
            return out;
        }
    }

    /** ByteLevel add_prefix_space: a space before every piece that does not start with one. */
    static final class PrefixSpace extends PreTokenizer {
        @Override
        List<String> apply(List<String> pieces) {
            List<String> out = new ArrayList<>();
            for (String p : pieces) {
                out.add(p.startsWith(" ") ? p : " " + p);
            }
            return out;
        }
    }
}
