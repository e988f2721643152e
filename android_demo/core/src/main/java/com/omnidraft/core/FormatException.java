package com.omnidraft.core;

import java.io.IOException;

/** A file the core reads (vocabulary map, tokenizer, trace) is foreign, newer, truncated or corrupted. */
public final class FormatException extends IOException {
    private static final long serialVersionUID = 1L;

    public final String source;
    public final String problem;

    public FormatException(String source, String problem) {
        super(source + ": " + problem);
        this.source = source;
        this.problem = problem;
    }
}
