package com.omnidraft.core;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;

/** File helpers that stay within Android API 26 (no readAllBytes, no HexFormat). */
final class Files2 {
    private Files2() {}

    static byte[] readAll(File file) throws IOException {
        try (InputStream in = new FileInputStream(file)) {
            ByteArrayOutputStream out = new ByteArrayOutputStream((int) Math.min(file.length(), 1 << 20));
            byte[] chunk = new byte[1 << 16];
            for (int n; (n = in.read(chunk)) > 0; ) {
                out.write(chunk, 0, n);
            }
            return out.toByteArray();
        }
    }

    /** Streaming SHA-256 as lowercase hex, the form manifest.json stores. */
    static String sha256Hex(File file) throws IOException {
        MessageDigest md;
        try {
            md = MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException("SHA-256 is mandatory in every JVM", e);
        }
        try (InputStream in = new FileInputStream(file)) {
            byte[] chunk = new byte[1 << 20];
            for (int n; (n = in.read(chunk)) > 0; ) {
                md.update(chunk, 0, n);
            }
        }
        StringBuilder hex = new StringBuilder(64);
        for (byte b : md.digest()) {
            hex.append(Character.forDigit((b >> 4) & 0xF, 16)).append(Character.forDigit(b & 0xF, 16));
        }
        return hex.toString();
    }
}
