package com.omnidraft.core;

import java.io.IOException;

/** An n-gram cache file is foreign, newer, truncated, corrupted or for other vocabularies. */
public final class NGramFormatException extends IOException {
    private static final long serialVersionUID = 1L;

    public final String source;
    public final String problem;

    public NGramFormatException(String source, String problem) {
        super(source + ": " + problem);
        this.source = source;
        this.problem = problem;
    }
}
