"""numba kernels of the circuit-data cache: the A/B counting sort into coded rows, and the body hash.

:func:`scatter_rows` sorts the zkey's coefficient entries into the A and B rows (stable within
a row, like :func:`cuzk_mp.formats.zkey_kernels.fill_rows`) writing a column and a code per entry
instead of 32 bytes. :func:`body_hash` is a fast non-cryptographic 64-bit hash of the cache
file's body (four independent lanes per block, blocks in parallel, combined in block order), so a
worker can check a cache file of hundreds of MB at open in a fraction of a second and never run
on a truncated or damaged one; the result does not depend on the thread count.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

HASH_BLOCK_WORDS = 1 << 16
_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)


@njit(cache=True)
def scatter_rows(m, c, s, codes, ptr_a, ptr_b, cols_a, cols_b, codes_a, codes_b):  # type: ignore[no-untyped-def]
    """Entry i (matrix m[i], row c[i], column s[i], code codes[i]) goes to the next free place of its row.

    ``ptr_a``/``ptr_b`` are the row pointers from the entries' row counts (every entry's row is
    below their length - 1).
    """
    nxt_a = ptr_a[:-1].astype(np.int64)
    nxt_b = ptr_b[:-1].astype(np.int64)
    for i in range(m.shape[0]):
        row = c[i]
        if m[i] == 0:
            p = nxt_a[row]
            nxt_a[row] = p + 1
            cols_a[p] = s[i]
            codes_a[p] = codes[i]
        else:
            p = nxt_b[row]
            nxt_b[row] = p + 1
            cols_b[p] = s[i]
            codes_b[p] = codes[i]


@njit(inline="always")
def _mix(h, x):  # type: ignore[no-untyped-def]
    h = (h ^ (x * _P1)) * _P2
    return h ^ (h >> np.uint64(31))


@njit(parallel=True, cache=True)
def _block_hashes(words, out):  # type: ignore[no-untyped-def]
    n = words.shape[0]
    for b in prange(out.shape[0]):
        lo = b * HASH_BLOCK_WORDS
        hi = min(n, lo + HASH_BLOCK_WORDS)
        h0 = np.uint64(b) * _P3 + np.uint64(1)
        h1 = h0 ^ _P1
        h2 = h0 ^ _P2
        h3 = h0 ^ _P3
        i = lo
        while i + 4 <= hi:
            h0 = _mix(h0, words[i])
            h1 = _mix(h1, words[i + 1])
            h2 = _mix(h2, words[i + 2])
            h3 = _mix(h3, words[i + 3])
            i += 4
        while i < hi:
            h0 = _mix(h0, words[i])
            i += 1
        out[b] = _mix(_mix(_mix(h0, h1), h2), h3)


def body_hash(words: np.ndarray) -> int:
    """64-bit hash of a uint64 array (the same for any thread count)."""
    out = np.zeros(max(1, -(-words.shape[0] // HASH_BLOCK_WORDS)), dtype=np.uint64)
    _block_hashes(words, out)
    h = np.uint64(words.shape[0])
    with np.errstate(over="ignore"):
        for x in out:
            h = np.uint64((int(h) * int(_P3) + int(x)) & 0xFFFFFFFFFFFFFFFF)
            h ^= h >> np.uint64(29)
    return int(h)
