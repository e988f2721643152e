package com.omnidraft.core;

import java.util.Random;

/**
 * Source of uniform draws in [0, 1) for sampling and rejection tests. The phone uses a seeded
 * java.util.Random; the golden-trace replay uses the draws Python recorded, in order.
 */
public interface Uniforms {
    double next();

    static Uniforms seeded(long seed) {
        Random random = new Random(seed);
        return random::nextDouble;
    }
}
