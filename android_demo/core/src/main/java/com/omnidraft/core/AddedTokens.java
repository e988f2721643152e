package com.omnidraft.core;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

/**
 * The added (special) tokens of a tokenizer.json, split out of the raw text before normalisation:
 * leftmost match, longest among those starting at the same place (Hugging Face's added
 * vocabulary with lstrip / rstrip / single_word all false, as in the shipped files).
 */
final class AddedTokens {
    /** A piece of text, or an added token (id >= 0). */
    static final class Segment {
        final String text;
        final int id;

        Segment(String text, int id) {
            this.text = text;
            this.id = id;
        }
    }

    private final Map<Character, List<String>> byFirst = new HashMap<>();
    private final Map<String, Integer> ids = new HashMap<>();

    void add(String content, int id) {
        if (content.isEmpty()) {
            return;
        }
        ids.put(content, id);
        List<String> list = byFirst.computeIfAbsent(content.charAt(0), c -> new ArrayList<>());
        list.add(content);
        list.sort((a, b) -> b.length() - a.length()); // longest first
    }

    List<Segment> split(String text) {
        List<Segment> out = new ArrayList<>();
        int plain = 0;
        int i = 0;
        while (i < text.length()) {
            String hit = null;
            List<String> candidates = byFirst.get(text.charAt(i));
            if (candidates != null) {
                for (String c : candidates) {
                    if (text.startsWith(c, i)) {
                        hit = c;
                        break;
                    }
                }
            }
            if (hit == null) {
                i++;
                continue;
            }
            if (i > plain) {
                out.add(new Segment(text.substring(plain, i), -1));
            }
            out.add(new Segment(hit, ids.get(hit)));
            i += hit.length();
            plain = i;
        }
        if (plain < text.length()) {
            out.add(new Segment(text.substring(plain), -1));
        }
        return out;
    }
}
