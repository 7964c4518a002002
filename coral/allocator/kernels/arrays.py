"""Array helpers of the allocator's compiled kernels (numba, `jit.py`): searches in sorted
arrays, a stable sort, growing buffers and a heap's sift, written as loops so that the kernels
that call them compile without numpy's sorting and slicing machinery (which costs seconds of
compilation; see "Cold start of the allocator" in `benchmarks/results/allocator.md`).

Each reproduces the numpy operation the kernels replaced, ties included (`argsort` is
`np.argsort(kind="stable")`), so that the kernels' answers are the array code's bit for bit.
"""

from __future__ import annotations

import numpy as np

from coral.allocator.kernels.jit import jit as _jit


@_jit("int64(float64[::1], int64, float64)")
def search_left(arr: np.ndarray, n: int, value: float) -> int:
    """`np.searchsorted(arr[:n], value, side="left")` (arr non-decreasing), halving a fixed
    number of times."""
    if n == 0:
        return 0
    base = 0
    while n > 1:
        half = n >> 1
        base = base + half if arr[base + half - 1] < value else base
        n -= half
    return base + 1 if arr[base] < value else base


@_jit("int64(float64[::1], int64, float64, int64)")
def search_from(arr: np.ndarray, n: int, value: float, lo: int) -> int:
    """`np.searchsorted(arr[:n], value, side="left")` when it is known to be `lo` or more:
    galloping up from `lo`, then halving."""
    if lo >= n or arr[lo] >= value:
        return lo
    step = 1
    below = lo  # arr[below] < value
    hi = lo + 1
    while hi < n and arr[hi] < value:
        below = hi
        step *= 2
        hi = below + step
    if hi > n:
        hi = n
    lo = below + 1  # the answer is in lo..hi
    while lo < hi:
        mid = (lo + hi) >> 1
        if arr[mid] < value:
            lo = mid + 1
        else:
            hi = mid
    return lo


@_jit("int64[::1](float64[::1], int64)")
def argsort(key: np.ndarray, n: int) -> np.ndarray:
    """Stable `np.argsort(key[:n], kind="stable")` (a merge sort over runs of 16; a helper
    of its own rather than numpy's, whose generic sort takes seconds to compile)."""
    idx = np.empty(n, dtype=np.int64)
    for i in range(n):
        idx[i] = i
    width = 16
    for first in range(0, n, width):
        end = min(first + width, n)
        for i in range(first + 1, end):
            v = idx[i]
            kv = key[v]
            j = i - 1
            while j >= first and key[idx[j]] > kv:
                idx[j + 1] = idx[j]
                j -= 1
            idx[j + 1] = v
    buf = np.empty(n, dtype=np.int64)
    while width < n:
        for left in range(0, n, 2 * width):
            mid = min(left + width, n)
            right = min(left + 2 * width, n)
            i, j, k = left, mid, left
            while i < mid and j < right:
                if key[idx[j]] < key[idx[i]]:
                    buf[k] = idx[j]
                    j += 1
                else:
                    buf[k] = idx[i]
                    i += 1
                k += 1
            while i < mid:
                buf[k] = idx[i]
                i += 1
                k += 1
            while j < right:
                buf[k] = idx[j]
                j += 1
                k += 1
        idx, buf = buf, idx
        width *= 2
    return idx


@_jit("int64[::1](int64[::1], int64)")
def grow_int(arr: np.ndarray, need: int) -> np.ndarray:
    if need <= arr.shape[0]:
        return arr
    out = np.empty(max(need, 2 * arr.shape[0]), dtype=np.int64)
    for i in range(arr.shape[0]):
        out[i] = arr[i]
    return out


@_jit("float64[::1](float64[::1], int64)")
def grow_float(arr: np.ndarray, need: int) -> np.ndarray:
    if need <= arr.shape[0]:
        return arr
    out = np.empty(max(need, 2 * arr.shape[0]))
    for i in range(arr.shape[0]):
        out[i] = arr[i]
    return out


@_jit("void(float64[::1], int64[::1], int64, int64)")
def sift(key: np.ndarray, item: np.ndarray, size: int, root: int) -> None:
    """Restore the max-heap `key[:size]` (with `item` alongside) below `root`."""
    k = key[root]
    it = item[root]
    while True:
        child = 2 * root + 1
        if child >= size:
            break
        if child + 1 < size and key[child + 1] > key[child]:
            child += 1
        if key[child] <= k:
            break
        key[root] = key[child]
        item[root] = item[child]
        root = child
    key[root] = k
    item[root] = it
