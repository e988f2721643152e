package com.omnidraft.core;

import java.util.Arrays;

/**
 * Which token ids a model's position-addressed KV cache holds (omnidraft_deploy.speculative.kv_reuse):
 * a call at {@code start} writes its ids' entries at start, start+1, ... from what the cache holds
 * before start, so the entry at position p is valid for a text exactly when the ids fed at 0..p are
 * that text's first p+1 ids. The decoder starts a prompt's prefill after the longest prefix it shares
 * with them (at most all but its last id, whose logits the first step reads): a chat app that keeps
 * its Session prefills the system turn once and earlier turns not at all.
 */
public final class CachedTokens {
    private int[] ids = new int[16];
    private int size;

    public int size() {
        return size;
    }

    /**
     * A call wrote {@code fed} at {@code start..}: they replace whatever lay from start on. A call that
     * starts past the record leaves unknown entries before it, so the record stops before the gap.
     */
    public void fed(int[] fed, int start) {
        if (start > size) {
            return;
        }
        size = start;
        if (size + fed.length > ids.length) {
            ids = Arrays.copyOf(ids, Math.max(2 * ids.length, size + fed.length));
        }
        System.arraycopy(fed, 0, ids, size, fed.length);
        size += fed.length;
    }

    /** Forget every position from n on (their entries stay, unused, until overwritten). */
    public void keep(int n) {
        size = Math.max(0, Math.min(size, n));
    }

    /** Leading ids of {@code prompt} that need no prefill: the shared prefix short of its last id. */
    public int reusable(int[] prompt) {
        int limit = Math.min(size, prompt.length - 1);
        int n = 0;
        while (n < limit && ids[n] == prompt[n]) {
            n++;
        }
        return n;
    }

    /** {@code lm}'s reusable prefix of {@code prompt}: 0 for a model that keeps no record. */
    public static int reusable(CausalLm lm, int[] prompt) {
        CachedTokens record = lm.cached();
        return record == null ? 0 : record.reusable(prompt);
    }
}
