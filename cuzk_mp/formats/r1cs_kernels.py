"""numba kernels that decode and encode .r1cs section 2 (the constraints).

Section 2 is nConstraints x {A, B, C}; each linear combination is nTerms u32
then nTerms x {wireId u32, coef 32 bytes LE}. Records have variable length,
so decoding is two passes: :func:`scan_constraints` hops from count to count
(sequential, it only reads 3 u32 per constraint) and records each constraint's
byte offset; :func:`fill_matrix` then decodes one matrix of a range of
constraints in parallel into CSR arrays whose row pointers came from the
counts (so one matrix can be read alone, a bounded chunk at a time). :func:`encode_rows`
is the inverse for a range of rows. Bytes are assembled by shifts, so nothing
depends on the alignment of the mapped file. :mod:`.r1cs` imports this module at its first
decode or encode, so reading a key's header costs no numba.
"""

from __future__ import annotations

import numpy as np

from ..algebra.jit import njit, prange

ERR_TRUNCATED = 1
ERR_EXTRA = 2
ERR_WIRE = 3
ERR_COEF = 4
ERR_DUPLICATE = 5
LC_NAMES = ("A", "B", "C")
TERM_BYTES = 4 + 32


@njit(inline="always", cache=True)
def _rd_u32(raw, p):  # type: ignore[no-untyped-def]
    return (np.uint32(raw[p]) | (np.uint32(raw[p + 1]) << np.uint32(8))
            | (np.uint32(raw[p + 2]) << np.uint32(16)) | (np.uint32(raw[p + 3]) << np.uint32(24)))


@njit(inline="always", cache=True)
def _rd_u64(raw, p):  # type: ignore[no-untyped-def]
    v = np.uint64(0)
    for j in range(8):
        v |= np.uint64(raw[p + j]) << np.uint64(8 * j)
    return v


@njit(inline="always", cache=True)
def _wr_u32(buf, p, v):  # type: ignore[no-untyped-def]
    for j in range(4):
        buf[p + j] = np.uint8((np.uint32(v) >> np.uint32(8 * j)) & np.uint32(0xFF))


@njit(inline="always", cache=True)
def _wr_u64(buf, p, v):  # type: ignore[no-untyped-def]
    for j in range(8):
        buf[p + j] = np.uint8((v >> np.uint64(8 * j)) & np.uint64(0xFF))


@njit(inline="always", cache=True)
def _lt_r(l0, l1, l2, l3, r):  # type: ignore[no-untyped-def]
    """(l3 l2 l1 l0) < r, limbs compared from the top."""
    if l3 != r[3]:
        return l3 < r[3]
    if l2 != r[2]:
        return l2 < r[2]
    if l1 != r[1]:
        return l1 < r[1]
    return l0 < r[0]


@njit(cache=True)
def scan_constraints(raw, n8, offsets, counts):  # type: ignore[no-untyped-def]
    """Pass 1: offsets[i] = byte offset of constraint i; counts[m, i] = terms of its LC m.

    Returns status (code, constraint, matrix, byte): code 0 ok, ERR_TRUNCATED
    when a count or its terms run past the section, ERR_EXTRA when bytes remain.
    """
    status = np.zeros(4, dtype=np.int64)
    size = raw.shape[0]
    rec = 4 + n8
    pos = 0
    for i in range(offsets.shape[0]):
        offsets[i] = pos
        for m in range(3):
            if pos + 4 > size:
                status[0], status[1], status[2], status[3] = ERR_TRUNCATED, i, m, pos
                return status
            k = np.int64(_rd_u32(raw, pos))
            end = pos + 4 + k * rec
            if end > size:
                status[0], status[1], status[2], status[3] = ERR_TRUNCATED, i, m, pos
                return status
            counts[m, i] = k
            pos = end
    if pos != size:
        status[0], status[1], status[2], status[3] = ERR_EXTRA, offsets.shape[0], 0, pos
    return status


@njit(cache=True)
def _read_lc(raw, pos, idx, data, dst, n_wires, r):  # type: ignore[no-untyped-def]
    """Decode one linear combination at ``pos`` into idx/data from row ``dst``; returns (next pos, error)."""
    k = np.int64(_rd_u32(raw, pos))
    pos += 4
    ordered = True
    prev = np.int64(-1)
    for t in range(k):
        w = np.int64(_rd_u32(raw, pos))
        if w >= n_wires:
            return pos, ERR_WIRE
        l0 = _rd_u64(raw, pos + 4)
        l1 = _rd_u64(raw, pos + 12)
        l2 = _rd_u64(raw, pos + 20)
        l3 = _rd_u64(raw, pos + 28)
        if not _lt_r(l0, l1, l2, l3, r):
            return pos, ERR_COEF
        idx[dst + t] = w
        data[dst + t, 0], data[dst + t, 1], data[dst + t, 2], data[dst + t, 3] = l0, l1, l2, l3
        ordered = ordered and w > prev
        prev = w
        pos += TERM_BYTES
    if not ordered:
        s = np.sort(idx[dst : dst + k])
        for t in range(1, k):
            if s[t] == s[t - 1]:
                return pos, ERR_DUPLICATE
    return pos, 0


@njit(parallel=True, cache=True)
def fill_matrix(raw, offsets, counts, m, lo, indptr, idx, data, n_wires, r, errors):  # type: ignore[no-untyped-def]
    """Pass 2 (parallel over constraints): decode matrix ``m`` (0 A, 1 B, 2 C) of constraints
    lo .. lo+len(errors)-1 into CSR arrays (constraint lo+j from entry indptr[j] - indptr[0]);
    errors[j] = its error code (0: fine)."""
    base = indptr[0]
    for j in prange(errors.shape[0]):
        i = lo + j
        pos = offsets[i]
        for k in range(m):
            pos += 4 + np.int64(counts[k, i]) * TERM_BYTES
        _, err = _read_lc(raw, pos, idx, data, np.int64(indptr[j] - base), n_wires, r)
        errors[j] = err


@njit(cache=True)
def _put_lc(buf, pos, indptr, idx, data, i, n_wires, r):  # type: ignore[no-untyped-def]
    """Encode row ``i`` of one CSR matrix at ``pos``; returns (next pos, error)."""
    lo = indptr[i]
    hi = indptr[i + 1]
    _wr_u32(buf, pos, hi - lo)
    pos += 4
    for k in range(lo, hi):
        if np.int64(idx[k]) >= n_wires:
            return pos, ERR_WIRE
        if not _lt_r(data[k, 0], data[k, 1], data[k, 2], data[k, 3], r):
            return pos, ERR_COEF
        _wr_u32(buf, pos, idx[k])
        for j in range(4):
            _wr_u64(buf, pos + 4 + 8 * j, data[k, j])
        pos += TERM_BYTES
    return pos, 0


@njit(parallel=True, cache=True)
def encode_rows(pa, ia, da, pb, ib, db, pc, ic, dc, lo, starts, n_wires, r, buf):  # type: ignore[no-untyped-def]
    """Encode constraints lo .. lo+len(starts)-1 into buf (row j at starts[j]).

    Returns status (code, constraint, matrix): code 0, ERR_WIRE or ERR_COEF.
    """
    n = starts.shape[0]
    errors = np.zeros(n, dtype=np.int8)
    which = np.zeros(n, dtype=np.int8)
    for j in prange(n):
        i = lo + j
        pos, err = _put_lc(buf, starts[j], pa, ia, da, i, n_wires, r)
        m = 0
        if err == 0:
            m = 1
            pos, err = _put_lc(buf, pos, pb, ib, db, i, n_wires, r)
        if err == 0:
            m = 2
            pos, err = _put_lc(buf, pos, pc, ic, dc, i, n_wires, r)
        errors[j] = err
        which[j] = m
    status = np.zeros(3, dtype=np.int64)
    for j in range(n):
        if errors[j] != 0:
            status[0], status[1], status[2] = errors[j], lo + j, which[j]
            break
    return status
