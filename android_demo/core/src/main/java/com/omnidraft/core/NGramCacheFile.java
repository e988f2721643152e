package com.omnidraft.core;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.List;

/** Decoded contents of an ODNG file: header fields plus entries in eviction order. */
public final class NGramCacheFile {
    public static final int POLICY_LRU = 0;
    public static final int POLICY_LFU = 1;

    /** One n-gram: drafter ids (n >= 2) that merge into one target id, with its use count. */
    public static final class Entry {
        private final int[] draftIds;
        public final int targetId;
        public final long uses; // u32

        public Entry(int[] draftIds, int targetId, long uses) {
            this.draftIds = draftIds.clone();
            this.targetId = targetId;
            this.uses = uses;
        }

        public int[] draftIds() {
            return draftIds.clone();
        }

        public int n() {
            return draftIds.length;
        }

        @Override
        public String toString() {
            return Arrays.toString(draftIds) + " -> " + targetId + " x" + uses;
        }
    }

    public final int version;
    public final int policyId; // POLICY_LRU or POLICY_LFU
    public final int draftVocabSize;
    public final int targetVocabSize;
    private final List<Entry> entries; // next victim first

    public NGramCacheFile(int version, int policyId, int draftVocabSize, int targetVocabSize,
                          List<Entry> entries) {
        this.version = version;
        this.policyId = policyId;
        this.draftVocabSize = draftVocabSize;
        this.targetVocabSize = targetVocabSize;
        this.entries = Collections.unmodifiableList(new ArrayList<>(entries));
    }

    public List<Entry> entries() {
        return entries;
    }

    public String policyName() {
        return policyId == POLICY_LFU ? "lfu" : "lru";
    }
}
