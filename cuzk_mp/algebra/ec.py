"""G1 and G2 arithmetic as numba kernels, and batch fixed-base scalar multiplication.

Curves (a = 0): G1: y^2 = x^3 + 4 over Fq; G2: y^2 = x^3 + 4(1 + u) over Fq2.
Every formula is written once over the generic ``fe_*`` field API of
:mod:`cuzk_mp.algebra.fq2` and compiled for both groups; which group a kernel
runs on is chosen by its ``like`` argument (``FQ_ZERO`` or ``FQ2_ZERO``).

Layouts (``cuzk_mp.backends.base``): affine rows are the zkey layout, G1
``(n, 12)`` = x, y and G2 ``(n, 24)`` = x.c0, x.c1, y.c0, y.c1, Montgomery
limbs, infinity = all zeros. Jacobian rows append Z: ``(n, 18)`` / ``(n, 36)``,
(X, Y, Z) meaning (X/Z^2, Y/Z^3), infinity = Z = 0.

Fixed-base multiplication (the dev setup's workload) avoids projective
coordinates altogether: every point is a sum of ~256/c precomputed table
entries, and the sums are done in *affine* coordinates for a whole block of
points at once, sharing one field inversion per block and step (Montgomery's
trick), which costs about 6M + 1S per addition instead of 7M + 4S (mixed
Jacobian) plus a final normalisation.

numba's disk cache is keyed on this file only: after editing fq2.py or fq_kernels.py,
delete the algebra package's ``__pycache__``.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import numpy as np
from numba import get_num_threads

from . import fq, fr
from .fq2 import (
    FQ2_ZERO, FQ_ZERO, fe_add, fe_inv, fe_is_zero, fe_load, fe_mul, fe_one, fe_sqr, fe_store, fe_sub, fe_zero,
)
from .jit import njit, prange

G1Affine = tuple[int, int]
G2Affine = tuple[tuple[int, int], tuple[int, int]]
SCALAR_BITS = 256  # windows cover 256 bits: a signed-digit carry out of bit 254 still fits (r < 2^255)
MAX_WINDOW = 16  # table of ceil(256/16) * 2^15 points: 50 MB for G1, 100 MB for G2

# ------------------------------------------------------------------ Jacobian formulas (EFD, a = 0)


@njit
def jac_infinity(like):  # type: ignore[no-untyped-def]
    """The point at infinity (1, 1, 0) in Jacobian coordinates."""
    one = fe_one(like)
    return one, one, fe_zero(like)


@njit
def jac_dbl(X, Y, Z):  # type: ignore[no-untyped-def]
    """2P. EFD g1p/shortw/jacobian-0 dbl-2009-l: 2M + 5S."""
    if fe_is_zero(Z) or fe_is_zero(Y):
        return jac_infinity(Z)
    A = fe_sqr(X)
    B = fe_sqr(Y)
    C = fe_sqr(B)
    D = fe_sub(fe_sub(fe_sqr(fe_add(X, B)), A), C)
    D = fe_add(D, D)
    E = fe_add(fe_add(A, A), A)
    X3 = fe_sub(fe_sqr(E), fe_add(D, D))
    C2 = fe_add(C, C)
    C4 = fe_add(C2, C2)
    Y3 = fe_sub(fe_mul(E, fe_sub(D, X3)), fe_add(C4, C4))
    Z3 = fe_mul(Y, Z)
    return X3, Y3, fe_add(Z3, Z3)


@njit
def jac_add(X1, Y1, Z1, X2, Y2, Z2):  # type: ignore[no-untyped-def]
    """P + Q. EFD g1p/shortw/jacobian-0 add-2007-bl: 11M + 5S; P == Q doubles, P == -Q gives infinity."""
    if fe_is_zero(Z1):
        return X2, Y2, Z2
    if fe_is_zero(Z2):
        return X1, Y1, Z1
    Z1Z1 = fe_sqr(Z1)
    Z2Z2 = fe_sqr(Z2)
    U1 = fe_mul(X1, Z2Z2)
    U2 = fe_mul(X2, Z1Z1)
    S1 = fe_mul(fe_mul(Y1, Z2), Z2Z2)
    S2 = fe_mul(fe_mul(Y2, Z1), Z1Z1)
    H = fe_sub(U2, U1)
    r = fe_sub(S2, S1)
    if fe_is_zero(H):
        return jac_dbl(X1, Y1, Z1) if fe_is_zero(r) else jac_infinity(Z1)
    H2 = fe_add(H, H)
    I = fe_sqr(H2)
    J = fe_mul(H, I)
    r = fe_add(r, r)
    V = fe_mul(U1, I)
    X3 = fe_sub(fe_sub(fe_sqr(r), J), fe_add(V, V))
    S1J = fe_mul(S1, J)
    Y3 = fe_sub(fe_mul(r, fe_sub(V, X3)), fe_add(S1J, S1J))
    Z3 = fe_mul(fe_sub(fe_sub(fe_sqr(fe_add(Z1, Z2)), Z1Z1), Z2Z2), H)
    return X3, Y3, Z3


@njit
def jac_madd(X1, Y1, Z1, x2, y2):  # type: ignore[no-untyped-def]
    """P + Q for affine Q ((0, 0) = infinity). EFD madd-2007-bl: 7M + 4S; P == +-Q handled."""
    if fe_is_zero(x2) and fe_is_zero(y2):
        return X1, Y1, Z1
    if fe_is_zero(Z1):
        return x2, y2, fe_one(x2)
    Z1Z1 = fe_sqr(Z1)
    U2 = fe_mul(x2, Z1Z1)
    S2 = fe_mul(fe_mul(y2, Z1), Z1Z1)
    H = fe_sub(U2, X1)
    r = fe_sub(S2, Y1)
    if fe_is_zero(H):
        return jac_dbl(X1, Y1, Z1) if fe_is_zero(r) else jac_infinity(Z1)
    HH = fe_sqr(H)
    I = fe_add(HH, HH)
    I = fe_add(I, I)
    J = fe_mul(H, I)
    r = fe_add(r, r)
    V = fe_mul(X1, I)
    X3 = fe_sub(fe_sub(fe_sqr(r), J), fe_add(V, V))
    Y1J = fe_mul(Y1, J)
    Y3 = fe_sub(fe_mul(r, fe_sub(V, X3)), fe_add(Y1J, Y1J))
    Z3 = fe_sub(fe_sub(fe_sqr(fe_add(Z1, H)), Z1Z1), HH)
    return X3, Y3, Z3


# ------------------------------------------------------------------ batch kernels


@njit
def _normalize_range(jac, out, lo, hi, pref, like):  # type: ignore[no-untyped-def]
    # Montgomery's trick over the nonzero Z of rows [lo, hi): prefix products, one inversion, walk back.
    acc = fe_one(like)
    for i in range(lo, hi):
        z = fe_load(jac, i, 2, like)
        fe_store(pref, i - lo, 0, acc)
        if not fe_is_zero(z):
            acc = fe_mul(acc, z)
    inv = fe_inv(acc)
    zero = fe_zero(like)
    for i in range(hi - 1, lo - 1, -1):
        z = fe_load(jac, i, 2, like)
        if fe_is_zero(z):
            fe_store(out, i, 0, zero)
            fe_store(out, i, 1, zero)
            continue
        zi = fe_mul(inv, fe_load(pref, i - lo, 0, like))
        inv = fe_mul(inv, z)
        zi2 = fe_sqr(zi)
        fe_store(out, i, 0, fe_mul(fe_load(jac, i, 0, like), zi2))
        fe_store(out, i, 1, fe_mul(fe_load(jac, i, 1, like), fe_mul(zi2, zi)))


@njit
def _jac_op_row(p, q, i, op, like):  # type: ignore[no-untyped-def]
    X1, Y1, Z1 = fe_load(p, i, 0, like), fe_load(p, i, 1, like), fe_load(p, i, 2, like)
    if op == 0:
        return jac_add(X1, Y1, Z1, fe_load(q, i, 0, like), fe_load(q, i, 1, like), fe_load(q, i, 2, like))
    if op == 1:
        return jac_madd(X1, Y1, Z1, fe_load(q, i, 0, like), fe_load(q, i, 1, like))
    return jac_dbl(X1, Y1, Z1)


@njit
def _batch_add(acc, lo, cnt, inf, table, idx, neg, pref, kind, like):  # type: ignore[no-untyped-def]
    """acc[lo + t] += sign_t * table[idx[t]] in affine coordinates, for t < cnt, sharing one inversion.

    idx[t] < 0 skips t; neg[t] negates the table point; inf[t] says acc row lo+t is infinity
    (updated). Per addition: lambda = (y2 - y1)/(x2 - x1) (or 3x1^2 / 2y1 when doubling),
    x3 = lambda^2 - x1 - x2, y3 = lambda (x1 - x3) - y1; 6M + 1S with the shared inversion.
    kind[t]: 0 skip, 1 acc was infinity (copy), 2 add, 3 double, 4 result is infinity.
    """
    run = fe_one(like)
    for t in range(cnt):
        k = idx[t]
        if k < 0:
            kind[t] = 0
            continue
        if inf[t]:
            kind[t] = 1
            continue
        x1 = fe_load(acc, lo + t, 0, like)
        den = fe_sub(fe_load(table, k, 0, like), x1)
        kind[t] = 2
        if fe_is_zero(den):
            y1 = fe_load(acc, lo + t, 1, like)
            y2 = fe_load(table, k, 1, like)
            if neg[t]:
                y2 = fe_sub(fe_zero(like), y2)
            if fe_is_zero(fe_sub(y1, y2)) and not fe_is_zero(y1):
                kind[t] = 3
                den = fe_add(y1, y1)
            else:
                kind[t] = 4
                continue
        fe_store(pref, t, 0, run)
        run = fe_mul(run, den)
    inv = fe_inv(run)
    for t in range(cnt - 1, -1, -1):
        kd = kind[t]
        if kd == 0:
            continue
        if kd == 4:
            inf[t] = True
            continue
        k = idx[t]
        x2 = fe_load(table, k, 0, like)
        y2 = fe_load(table, k, 1, like)
        if neg[t]:
            y2 = fe_sub(fe_zero(like), y2)
        i = lo + t
        if kd == 1:
            fe_store(acc, i, 0, x2)
            fe_store(acc, i, 1, y2)
            inf[t] = False
            continue
        x1 = fe_load(acc, i, 0, like)
        y1 = fe_load(acc, i, 1, like)
        if kd == 2:
            den = fe_sub(x2, x1)
            num = fe_sub(y2, y1)
        else:
            den = fe_add(y1, y1)
            xx = fe_sqr(x1)
            num = fe_add(fe_add(xx, xx), xx)
        lam = fe_mul(num, fe_mul(inv, fe_load(pref, t, 0, like)))
        inv = fe_mul(inv, den)
        x3 = fe_sub(fe_sub(fe_sqr(lam), x1), x2)
        fe_store(acc, i, 1, fe_sub(fe_mul(lam, fe_sub(x1, x3)), y1))
        fe_store(acc, i, 0, x3)


@njit(cache=True)
def _window_bases(base, nwin, c, like):  # type: ignore[no-untyped-def]
    # B_j = 2^(c j) * base for j < nwin, by single-point affine doublings (256 inversions in all).
    out = np.empty((nwin, base.shape[1]), np.uint64)
    out[0] = base[0]
    acc = base.copy()
    zero_idx = np.zeros(1, np.int64)
    inf = np.zeros(1, np.bool_)
    neg = np.zeros(1, np.bool_)
    pref = np.empty((1, base.shape[1] // 2), np.uint64)
    kind = np.empty(1, np.int8)
    for j in range(1, nwin):
        for _ in range(c):
            _batch_add(acc, 0, 1, inf, acc, zero_idx, neg, pref, kind, like)
        out[j] = acc[0]
    return out


@njit(cache=True)
def _add_affine_kernel(p, q, like):  # type: ignore[no-untyped-def]
    # out = p + q elementwise through one _batch_add (one inversion for the whole array).
    n = p.shape[0]
    out = p.copy()
    inf = np.empty(n, np.bool_)
    idx = np.empty(n, np.int64)
    for i in range(n):
        inf[i] = not p[i].any()
        idx[i] = i if q[i].any() else -1
    _batch_add(out, 0, n, inf, q, idx, np.zeros(n, np.bool_), np.empty((n, p.shape[1] // 2), np.uint64),
               np.empty(n, np.int8), like)
    for i in range(n):
        if inf[i]:
            out[i, :] = 0
    return out


@njit(inline="always")
def _window_value(s, i, bit, c):  # type: ignore[no-untyped-def]
    # Bits [bit, bit + c) of the 256-bit scalar row s[i] (c <= 16, so at most two limbs).
    limb = bit >> 6
    sh = bit & 63
    v = s[i, limb] >> np.uint64(sh)
    if sh + c > 64 and limb < 3:
        v |= s[i, limb + 1] << np.uint64(64 - sh)
    return np.int64(v & np.uint64((1 << c) - 1))


def _make_kernels(like: tuple) -> SimpleNamespace:
    """The parallel kernels of one group, with its field type baked in as a constant.

    (numba's parallel lowering cannot pass a tuple argument into a prange body, so the
    field witness ``like`` is a closure constant here; the disk cache keys on its value.)
    """

    @njit(parallel=True, cache=True)
    def to_affine(jac, out, chunk):  # type: ignore[no-untyped-def]
        n = jac.shape[0]
        for c in prange((n + chunk - 1) // chunk):
            lo = c * chunk
            hi = min(n, lo + chunk)
            _normalize_range(jac, out, lo, hi, np.empty((hi - lo, jac.shape[1] // 3), np.uint64), like)

    @njit(parallel=True, cache=True)
    def jac_op(p, q, out, op):  # type: ignore[no-untyped-def]
        # op 0: out = p + q (Jacobian + Jacobian); 1: out = p + q (Jacobian + affine); 2: out = 2p.
        for i in prange(p.shape[0]):
            X3, Y3, Z3 = _jac_op_row(p, q, i, op, like)
            fe_store(out, i, 0, X3)
            fe_store(out, i, 1, Y3)
            fe_store(out, i, 2, Z3)

    @njit(parallel=True, cache=True)
    def table(bases, tab, c):  # type: ignore[no-untyped-def]
        # Window j owns rows [j H, (j+1) H), row j H + d - 1 = d * B_j for d = 1..H, H = 2^(c-1).
        # Built by doubling the filled prefix: rows [k, 2k) = rows [0, k) + row k - 1 (= k B_j).
        h = 1 << (c - 1)
        half = max(1, h // 2)
        for j in prange(bases.shape[0]):
            row0 = j * h
            tab[row0] = bases[j]
            idx = np.empty(half, np.int64)
            inf = np.zeros(half, np.bool_)
            neg = np.zeros(half, np.bool_)
            pref = np.empty((half, tab.shape[1] // 2), np.uint64)
            kind = np.empty(half, np.int8)
            k = 1
            while k < h:
                for t in range(k):
                    tab[row0 + k + t] = tab[row0 + t]
                    idx[t] = row0 + k - 1
                _batch_add(tab, row0 + k, k, inf, tab, idx, neg, pref, kind, like)
                k *= 2

    @njit(parallel=True, cache=True)
    def fixed_base(scalars, tab, out, c, nwin, block):  # type: ignore[no-untyped-def]
        # Signed digits in (-H, H], H = 2^(c-1): digit d of window j adds sign(d) * tab[j H + |d| - 1].
        n = scalars.shape[0]
        h = 1 << (c - 1)
        for b in prange((n + block - 1) // block):
            lo = b * block
            cnt = min(block, n - lo)
            inf = np.ones(cnt, np.bool_)
            carry = np.zeros(cnt, np.int64)
            idx = np.empty(cnt, np.int64)
            neg = np.zeros(cnt, np.bool_)
            pref = np.empty((cnt, tab.shape[1] // 2), np.uint64)
            kind = np.empty(cnt, np.int8)
            for j in range(nwin):
                for t in range(cnt):
                    d = _window_value(scalars, lo + t, j * c, c) + carry[t]
                    carry[t] = 1 if d > h else 0
                    d -= carry[t] << c
                    neg[t] = d < 0
                    idx[t] = -1 if d == 0 else j * h + abs(d) - 1
                _batch_add(out, lo, cnt, inf, tab, idx, neg, pref, kind, like)
            for t in range(cnt):
                if inf[t]:
                    out[lo + t, :] = 0

    return SimpleNamespace(to_affine=to_affine, jac_op=jac_op, table=table, fixed_base=fixed_base, like=like)


_G1 = _make_kernels(FQ_ZERO)
_G2 = _make_kernels(FQ2_ZERO)


# ------------------------------------------------------------------ Python API


def _group(width: int, coords: int) -> SimpleNamespace:
    if width == 6 * coords:
        return _G1
    if width == 12 * coords:
        return _G2
    raise ValueError(f"expected rows of {6 * coords} (G1) or {12 * coords} (G2) uint64 limbs, got {width}")


def _rows(a: np.ndarray, coords: int) -> tuple[np.ndarray, SimpleNamespace]:
    if not isinstance(a, np.ndarray) or a.dtype != np.uint64 or a.ndim != 2:
        raise ValueError(f"expected a 2-D uint64 point array, got {getattr(a, 'dtype', type(a))} {np.shape(a)}")
    return np.ascontiguousarray(a), _group(a.shape[1], coords)


def window_bits(n: int) -> int:
    """Window width c for n fixed-base products: minimises ceil(256/c) * (2^(c-1) + n) additions.

    The table has 2^(c-1) entries per window, each one batch-affine addition to build, and every
    point costs one addition per window, so the two terms are in the same unit.
    """
    return min(range(1, MAX_WINDOW + 1), key=lambda c: -(-SCALAR_BITS // c) * ((1 << (c - 1)) + n))


def _fixed_base(base: np.ndarray, scalars: np.ndarray, group: SimpleNamespace, window: int | None) -> np.ndarray:
    if not isinstance(scalars, np.ndarray) or scalars.dtype != np.uint64 or scalars.ndim != 2 or scalars.shape[1] != 4:
        raise ValueError(f"scalars must be an (n, 4) uint64 Fr array, got {getattr(scalars, 'dtype', None)} "
                         f"{np.shape(scalars)}")
    scalars = np.ascontiguousarray(scalars)
    bad = fr.first_noncanonical(scalars)
    if bad >= 0:
        raise ValueError(f"scalar {bad} is not reduced mod r")
    n = scalars.shape[0]
    if n == 0 or not base.any():
        return np.zeros((n, base.shape[1]), np.uint64)
    c = window_bits(n) if window is None else window
    if not 1 <= c <= MAX_WINDOW:
        raise ValueError(f"window must be in 1..{MAX_WINDOW}, got {c}")
    nwin = -(-SCALAR_BITS // c)
    table = np.empty((nwin << (c - 1), base.shape[1]), np.uint64)
    group.table(_window_bases(base, nwin, c, group.like), table, c)
    block = int(min(2048, max(64, -(-n // (2 * get_num_threads())))))
    out = np.empty((n, base.shape[1]), np.uint64)
    group.fixed_base(scalars, table, out, c, nwin, block)
    return out


def fixed_base_g1(base_xy: G1Affine | None, scalars: np.ndarray, window: int | None = None) -> np.ndarray:
    """[s_i * base] for standard-form Fr scalars ``(n, 4) uint64``, as ``(n, 12)`` zkey-layout rows.

    ``base_xy`` is the affine base point as standard-form ints (None = infinity). Scalars 0 give
    all-zero rows. Windowed with signed digits: ceil(256/c) table additions per point, with the
    window c from :func:`window_bits` unless given.
    """
    return _fixed_base(g1_rows([base_xy]), scalars, _G1, window)


def fixed_base_g2(base: G2Affine | None, scalars: np.ndarray, window: int | None = None) -> np.ndarray:
    """[s_i * base] over G2 as ``(n, 24)`` zkey-layout rows; see :func:`fixed_base_g1`."""
    return _fixed_base(g2_rows([base]), scalars, _G2, window)


def to_jacobian(points: np.ndarray) -> np.ndarray:
    """Affine rows ``(n, 12|24)`` -> Jacobian rows ``(n, 18|36)`` with Z = 1 (Z = 0 for infinity)."""
    points, _ = _rows(points, 2)
    w = points.shape[1] // 2
    one = fq.ONE_MONT if w == 6 else np.concatenate([fq.ONE_MONT, np.zeros(6, np.uint64)])
    z = np.where(points.any(axis=1, keepdims=True), one, np.uint64(0)).astype(np.uint64)
    return np.ascontiguousarray(np.concatenate([points, z], axis=1))


def to_affine(jac: np.ndarray) -> np.ndarray:
    """Jacobian rows -> affine zkey-layout rows, one inversion per chunk (Montgomery's trick)."""
    jac, group = _rows(jac, 3)
    out = np.empty((jac.shape[0], 2 * jac.shape[1] // 3), np.uint64)
    group.to_affine(jac, out, max(256, -(-jac.shape[0] // (4 * get_num_threads()))))
    return out


def _jac_op(p: np.ndarray, q: np.ndarray, op: int, q_coords: int) -> np.ndarray:
    p, group = _rows(p, 3)
    q, group_q = _rows(q, q_coords)
    if group_q is not group or q.shape[0] != p.shape[0]:
        raise ValueError(f"point arrays do not match: {p.shape} and {q.shape}")
    out = np.empty_like(p)
    group.jac_op(p, q, out, op)
    return out


def add_affine(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Elementwise P + Q of affine zkey-layout rows, sharing one inversion (batch affine addition)."""
    p, group = _rows(p, 2)
    q, group_q = _rows(q, 2)
    if group_q is not group or q.shape[0] != p.shape[0]:
        raise ValueError(f"point arrays do not match: {p.shape} and {q.shape}")
    return _add_affine_kernel(p, q, group.like)


def add_jacobian(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Elementwise P + Q of Jacobian rows (add-2007-bl)."""
    return _jac_op(p, q, 0, 3)


def add_mixed(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Elementwise P + Q of Jacobian rows P and affine zkey-layout rows Q (madd-2007-bl)."""
    return _jac_op(p, q, 1, 2)


def double_jacobian(p: np.ndarray) -> np.ndarray:
    """Elementwise 2P of Jacobian rows (dbl-2009-l)."""
    return _jac_op(p, p, 2, 3)


def g1_rows(points: Sequence[G1Affine | None]) -> np.ndarray:
    """Affine standard-form int points (None = infinity) -> ``(n, 12)`` zkey-layout rows."""
    flat = [v for p in points for v in (p if p is not None else (0, 0))]
    rows = fq.from_ints(flat).reshape(-1, 12)
    rows[[p is None for p in points]] = 0
    return rows


def g1_points(rows: np.ndarray) -> list[G1Affine | None]:
    """``(n, 12)`` zkey-layout rows -> affine standard-form int points (None = infinity)."""
    v = fq.to_ints(np.ascontiguousarray(rows).reshape(-1, 6))
    return [None if not rows[i].any() else (v[2 * i], v[2 * i + 1]) for i in range(rows.shape[0])]


def g2_rows(points: Sequence[G2Affine | None]) -> np.ndarray:
    """Affine ((x0, x1), (y0, y1)) int points (None = infinity) -> ``(n, 24)`` zkey-layout rows."""
    flat = [v for p in points for c in (p if p is not None else ((0, 0), (0, 0))) for v in c]
    rows = fq.from_ints(flat).reshape(-1, 24)
    rows[[p is None for p in points]] = 0
    return rows


def g2_points(rows: np.ndarray) -> list[G2Affine | None]:
    """``(n, 24)`` zkey-layout rows -> affine ((x0, x1), (y0, y1)) int points (None = infinity)."""
    v = fq.to_ints(np.ascontiguousarray(rows).reshape(-1, 6))
    return [None if not rows[i].any() else ((v[4 * i], v[4 * i + 1]), (v[4 * i + 2], v[4 * i + 3]))
            for i in range(rows.shape[0])]
