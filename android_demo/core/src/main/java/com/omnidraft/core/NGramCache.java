package com.omnidraft.core;

import java.io.File;
import java.io.FileOutputStream;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;

/**
 * Online n-gram cache: drafter-id n-grams (n >= 2) that merge into one target id, bounded by an
 * entry count and optionally by accounted bytes, with LRU or LFU eviction. A line-by-line mirror of
 * omnidraft_deploy/ngram/cache.py and eviction.py: the same call sequence gives the same entries,
 * eviction order and use counts, so {@link #toFile} writes the bytes the Python writer writes.
 */
public final class NGramCache {
    public static final int DEFAULT_MAX_ENTRIES = 8192;
    public static final long MAX_USES = 0xFFFFFFFFL;
    static final int FILE_OVERHEAD = 28;

    /** An n-gram key: value semantics over an int array. */
    static final class Key {
        final int[] ids;
        private final int hash;

        Key(int[] ids) {
            this.ids = ids;
            this.hash = Arrays.hashCode(ids);
        }

        @Override
        public boolean equals(Object o) {
            return o instanceof Key && Arrays.equals(ids, ((Key) o).ids);
        }

        @Override
        public int hashCode() {
            return hash;
        }
    }

    /** Orders keys for eviction and counts their uses (eviction.py). */
    interface Policy {
        void add(Key key, long uses);

        void touch(Key key);

        void remove(Key key);

        Key victim();

        List<Map.Entry<Key, Long>> order();

        int id();
    }

    static final class Lru implements Policy {
        private final LinkedHashMap<Key, Long> uses = new LinkedHashMap<>();

        @Override public void add(Key key, long n) {
            uses.put(key, n);
        }

        @Override public void touch(Key key) {
            long n = Math.min(uses.remove(key) + 1, MAX_USES);
            uses.put(key, n);
        }

        @Override public void remove(Key key) {
            uses.remove(key);
        }

        @Override public Key victim() {
            return uses.keySet().iterator().next();
        }

        @Override public List<Map.Entry<Key, Long>> order() {
            return new ArrayList<>(uses.entrySet());
        }

        @Override public int id() {
            return NGramCacheFile.POLICY_LRU;
        }
    }

    static final class Lfu implements Policy {
        private final HashMap<Key, Long> uses = new HashMap<>();
        private final TreeMap<Long, LinkedHashMap<Key, Boolean>> buckets = new TreeMap<>();

        @Override public void add(Key key, long n) {
            uses.put(key, n);
            buckets.computeIfAbsent(n, k -> new LinkedHashMap<>()).put(key, Boolean.TRUE);
        }

        @Override public void touch(Key key) {
            long n = uses.get(key);
            if (n == MAX_USES) {
                LinkedHashMap<Key, Boolean> bucket = buckets.get(n);
                bucket.remove(key);
                bucket.put(key, Boolean.TRUE);
                return;
            }
            unlink(key, n);
            uses.put(key, n + 1);
            buckets.computeIfAbsent(n + 1, k -> new LinkedHashMap<>()).put(key, Boolean.TRUE);
        }

        @Override public void remove(Key key) {
            unlink(key, uses.remove(key));
        }

        @Override public Key victim() {
            return buckets.firstEntry().getValue().keySet().iterator().next();
        }

        @Override public List<Map.Entry<Key, Long>> order() {
            List<Map.Entry<Key, Long>> out = new ArrayList<>();
            for (Map.Entry<Long, LinkedHashMap<Key, Boolean>> b : buckets.entrySet()) {
                for (Key k : b.getValue().keySet()) {
                    out.add(new java.util.AbstractMap.SimpleImmutableEntry<>(k, b.getKey()));
                }
            }
            return out;
        }

        @Override public int id() {
            return NGramCacheFile.POLICY_LFU;
        }

        private void unlink(Key key, long n) {
            LinkedHashMap<Key, Boolean> bucket = buckets.get(n);
            bucket.remove(key);
            if (bucket.isEmpty()) {
                buckets.remove(n);
            }
        }
    }

    private final int maxEntries;
    private final long maxBytes; // <= 0: unbounded
    private final Policy policy;
    private final HashMap<Key, Integer> targets = new HashMap<>();
    private final TreeMap<Integer, Integer> lengthCounts = new TreeMap<>();
    private final TreeSet<Integer> lengths = new TreeSet<>();
    private long nbytes = FILE_OVERHEAD;
    public long hits;
    public long misses;
    public long inserts;
    public long evictions;
    public long skipped;

    /** policyId: NGramCacheFile.POLICY_LRU or POLICY_LFU; maxBytes <= 0: no byte bound. */
    public NGramCache(int maxEntries, long maxBytes, int policyId) {
        if (maxEntries < 1) {
            throw new IllegalArgumentException("max_entries must be >= 1, got " + maxEntries);
        }
        this.maxEntries = maxEntries;
        this.maxBytes = maxBytes;
        this.policy = policyId == NGramCacheFile.POLICY_LFU ? new Lfu() : new Lru();
    }

    /** Rebuilds a cache from a file's entries (next victim first): same order and use counts. */
    public static NGramCache fromFile(NGramCacheFile file, int maxEntries, long maxBytes) {
        NGramCache cache = new NGramCache(maxEntries, maxBytes, file.policyId);
        for (NGramCacheFile.Entry e : file.entries()) {
            cache.insert(new Key(e.draftIds()), e.targetId, e.uses);
        }
        return cache;
    }

    /** Inserts draftIds -> targetId, or touches it (the latest target id wins). */
    public void update(int[] draftIds, int targetId) {
        if (draftIds.length < 2 || draftIds.length > 255) {
            throw new IllegalArgumentException("an n-gram needs 2 <= n <= 255 draft ids, got n=" + draftIds.length);
        }
        Key key = new Key(draftIds.clone());
        if (targets.containsKey(key)) {
            targets.put(key, targetId);
            policy.touch(key);
        } else {
            insert(key, targetId, 1);
        }
    }

    /** {target id, n} of the longest cached n-gram equal to ids[start..start+n), or null. A hit is a use. */
    public int[] match(int[] ids, int start) {
        int room = ids.length - start;
        for (Iterator<Integer> it = lengths.descendingIterator(); it.hasNext(); ) {
            int n = it.next();
            if (n > room) {
                continue;
            }
            Key key = new Key(Arrays.copyOfRange(ids, start, start + n));
            Integer target = targets.get(key);
            if (target != null) {
                policy.touch(key);
                hits++;
                return new int[] {target, n};
            }
        }
        misses++;
        return null;
    }

    public int size() {
        return targets.size();
    }

    public long nbytes() {
        return nbytes;
    }

    /** The file contents: entries in eviction order with their use counts. */
    public NGramCacheFile toFile(int draftVocabSize, int targetVocabSize) {
        List<NGramCacheFile.Entry> entries = new ArrayList<>();
        for (Map.Entry<Key, Long> e : policy.order()) {
            entries.add(new NGramCacheFile.Entry(e.getKey().ids, targets.get(e.getKey()), e.getValue()));
        }
        return new NGramCacheFile(NGramCacheFormat.VERSION, policy.id(), draftVocabSize, targetVocabSize, entries);
    }

    /** Atomic save: write a temporary sibling, fsync, rename over the old file. */
    public void save(File path, int draftVocabSize, int targetVocabSize) throws IOException {
        writeAtomic(path, NGramCacheFormat.write(toFile(draftVocabSize, targetVocabSize)));
    }

    static void writeAtomic(File path, byte[] data) throws IOException {
        File dir = path.getAbsoluteFile().getParentFile();
        File tmp = File.createTempFile("." + path.getName() + ".", ".tmp", dir);
        try {
            try (FileOutputStream out = new FileOutputStream(tmp)) {
                out.write(data);
                out.getFD().sync();
            }
            Files.move(tmp.toPath(), path.toPath(), StandardCopyOption.ATOMIC_MOVE,
                    StandardCopyOption.REPLACE_EXISTING);
        } finally {
            if (tmp.exists() && !tmp.delete()) {
                tmp.deleteOnExit();
            }
        }
    }

    private void insert(Key key, int targetId, long uses) {
        long size = 9 + 4L * key.ids.length;
        if (maxBytes > 0 && FILE_OVERHEAD + size > maxBytes) {
            skipped++;
            return;
        }
        while (!targets.isEmpty() && (targets.size() >= maxEntries || (maxBytes > 0 && nbytes + size > maxBytes))) {
            evict();
        }
        policy.add(key, uses);
        targets.put(key, targetId);
        nbytes += size;
        inserts++;
        countLength(key.ids.length, +1);
    }

    private void evict() {
        Key key = policy.victim();
        policy.remove(key);
        targets.remove(key);
        nbytes -= 9 + 4L * key.ids.length;
        evictions++;
        countLength(key.ids.length, -1);
    }

    private void countLength(int n, int delta) {
        int count = lengthCounts.getOrDefault(n, 0) + delta;
        if (count == 0) {
            lengthCounts.remove(n);
            lengths.remove(n);
        } else {
            lengthCounts.put(n, count);
            lengths.add(n);
        }
    }
}
