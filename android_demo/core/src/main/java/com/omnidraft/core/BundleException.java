package com.omnidraft.core;

import java.io.IOException;

/** A bundle (or one file of it) is missing, corrupted, foreign or from a newer schema. */
public final class BundleException extends IOException {
    private static final long serialVersionUID = 1L;

    public final String path;
    public final String problem;

    public BundleException(String path, String problem) {
        super(path + ": " + problem);
        this.path = path;
        this.problem = problem;
    }
}
