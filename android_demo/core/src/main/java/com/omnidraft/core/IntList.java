package com.omnidraft.core;

import java.util.Arrays;

/** A growable int array (no boxing on the decoding path). */
public final class IntList {
    private int[] data;
    private int size;

    public IntList() {
        data = new int[16];
    }

    public IntList(int[] values) {
        data = values.length == 0 ? new int[16] : values.clone();
        size = values.length;
    }

    public int size() {
        return size;
    }

    public int get(int i) {
        if (i < 0 || i >= size) {
            throw new IndexOutOfBoundsException("index " + i + " of " + size);
        }
        return data[i];
    }

    public void add(int value) {
        if (size == data.length) {
            data = Arrays.copyOf(data, 2 * data.length);
        }
        data[size++] = value;
    }

    public void addAll(int[] values) {
        for (int v : values) {
            add(v);
        }
    }

    public void truncate(int newSize) {
        size = Math.min(size, newSize);
    }

    public int[] slice(int from, int to) {
        return Arrays.copyOfRange(data, from, to);
    }

    public int[] toArray() {
        return Arrays.copyOf(data, size);
    }

    @Override
    public String toString() {
        return Arrays.toString(toArray());
    }
}
