package com.omnidraft.core;

/** Printable form of a test string in failure messages. */
final class MiniJsonQuote {
    private MiniJsonQuote() {}

    static String quote(String s) {
        StringBuilder out = new StringBuilder("\"");
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c < 0x20 || c == '"' || c == '\\' || (c >= 0x7F && c < 0xA0)) {
                out.append(String.format("\\u%04x", (int) c));
            } else {
                out.append(c);
            }
        }
        return out.append('"').toString();
    }
}
