/* Batch fixed-base work with affine outputs in zkey layout:
 *   fixed_base_body  s_i * G from a precomputed window table (the dev setup: millions of
 *                    s_i, one G);
 *   pow2_body        2^c * P_i for every point of a table (the MSM's precomputed
 *                    multiples of resident key points: 2^(c w) P is c doublings of
 *                    2^(c (w-1)) P, one launch per multiple w).
 *
 * Table of fixed_base_body (built on the host, uploaded once): FB_NWIN = 32 unsigned
 * 8-bit windows, row j * 255 + d - 1 holds d 2^(8 j) G (affine, zkey layout), so
 * s G = sum_j table[j][byte_j(s)] over the non-zero bytes: at most 32 mixed XYZZ
 * additions, no doublings, and any 256-bit s works (s mod r follows from G's order).
 *
 * fixed_base_signed_body does the same from a table of signed windows of up to 16 bits
 * (half the additions at 16 bits; the table is made by fixed_base_body itself).
 *
 * Affine output by Montgomery's trick per thread (fb_stash / fb_to_affine): a thread
 * makes `per` consecutive points, keeping each XYZZ result and the running product of
 * the ZZZ's in `scratch`; one inversion of the product gives every 1/ZZZ_i on the way
 * back, and since ZZ^3 = ZZZ^2, 1/ZZ_i = (ZZ_i / ZZZ_i)^2: x = X (ZZ/ZZZ)^2, y = Y / ZZZ.
 * Cost per point: 3M (trick) + 4M (affine) + 1/per inversion. A result at infinity
 * (zero scalar, or an input point at infinity) stores the all-zero point.
 */
#pragma once
#include "../ec/xyzz.cuh"

/* The field inversion behind a call: inlined into this body, NVVM (cicc) spent ~110 s
 * on the G1 kernel alone (9.5 s without the inversion, 2.6 s for inv() in a kernel of
 * its own), and the G2 NVRTC compile did not finish in 3 minutes on the H200 host.
 * Called: 12.7 s (G1) / 29.7 s (G2) with nvcc -ptx here. One call per `per` points. */
template <class F>
EC_NOINLINE F fb_inv_call(const F& a) {
    return a.inv();
}

#define FB_WBITS 8
#define FB_NWIN 32
#define FB_ROWS ((1 << FB_WBITS) - 1) /* table rows per window: digits 1 .. 255 */

/* scratch row of item i: XYZZ (4 CW words), then the prefix product (CW words). */
template <class F>
FF_INLINE void fb_stash(const xyzz_t<F>& acc, F& prod, uint64_t* scratch, uint64_t i) {
    const int XW = xyzz_t<F>::WORDS, SW = XW + xyzz_t<F>::CW;
    if (!acc.is_inf()) prod = prod * acc.ZZZ;
    acc.store(scratch + i * SW);
    prod.store(scratch + i * SW + XW);
}

/* The back pass over items [i0, i1) stashed by fb_stash: out[i] = affine form of item i. */
template <class F>
FF_INLINE void fb_to_affine(F prod, const uint64_t* scratch, uint64_t* out, uint64_t i0, uint64_t i1) {
    const int AW = affine_t<F>::WORDS, XW = xyzz_t<F>::WORDS, SW = XW + xyzz_t<F>::CW;
    F inv = fb_inv_call(prod);
#pragma unroll 1
    for (uint64_t i = i1; i-- > i0;) {
        xyzz_t<F> p = xyzz_t<F>::load(scratch + i * SW);
        affine_t<F> a = affine_t<F>::inf();
        if (!p.is_inf()) {
            F before = i > i0 ? F::load(scratch + (i - 1) * SW + XW) : F::one();
            F t_zzz = inv * before; /* 1 / ZZZ_i */
            inv = inv * p.ZZZ;
            F iz = p.ZZ * t_zzz; /* 1 / Z */
            a = {p.X * iz.sqr(), p.Y * t_zzz};
        }
        a.store(out + i * AW);
    }
}

template <class F>
FF_INLINE void fixed_base_body(uint64_t t, const uint64_t* scalars, const uint64_t* table, uint64_t* out,
                               uint64_t* scratch, uint64_t n, uint32_t per) {
    const int AW = affine_t<F>::WORDS;
    uint64_t i0 = t * per, i1 = i0 + per < n ? i0 + per : n;
    F prod = F::one();
#pragma unroll 1
    for (uint64_t i = i0; i < i1; i++) {
        xyzz_t<F> acc = xyzz_t<F>::inf();
#pragma unroll 1
        for (int j = 0; j < FB_NWIN; j++) {
            uint32_t d = (uint32_t)(scalars[4 * i + j / 8] >> (8 * (j % 8))) & 0xff;
            if (d) acc.add_affine(affine_t<F>::load(table + (uint64_t)(j * FB_ROWS + d - 1) * AW));
        }
        fb_stash(acc, prod, scratch, i);
    }
    fb_to_affine(prod, scratch, out, i0, i1);
}

/* s_i * G from a table of signed windows of `wbits` bits (2 <= wbits <= 16), the dev setup's
 * large batches: nwin = ceil(256 / wbits) windows, digits in [-2^(wbits-1), 2^(wbits-1)]
 * (a window above half borrows 2^wbits from the next: d - 2^wbits, carry 1), so a window's
 * rows are its positive digits alone and a negative digit adds the row's negation (x, -y):
 * at most nwin + 1 mixed additions (16 + 1 at 16 bits, half of the 8-bit table's 32).
 * Table rows: j * half + d - 1 = d 2^(wbits j) G for j < nwin, 1 <= d <= half = 2^(wbits-1);
 * row nwin * half = 2^(wbits nwin) G (the last window's carry). Built on the device by
 * fixed_base_mul (fixed_base.py): 16 bits are 524 289 rows, 50 MB for G1, 101 MB for G2. */
template <class F>
FF_INLINE void fixed_base_signed_body(uint64_t t, const uint64_t* scalars, const uint64_t* table, uint64_t* out,
                                      uint64_t* scratch, uint64_t n, uint32_t per, uint32_t wbits) {
    const int AW = affine_t<F>::WORDS;
    const uint32_t nwin = (256 + wbits - 1) / wbits, half = 1u << (wbits - 1), full = 1u << wbits;
    uint64_t i0 = t * per, i1 = i0 + per < n ? i0 + per : n;
    F prod = F::one();
#pragma unroll 1
    for (uint64_t i = i0; i < i1; i++) {
        const uint64_t* s = scalars + 4 * i;
        xyzz_t<F> acc = xyzz_t<F>::inf();
        uint32_t carry = 0;
#pragma unroll 1
        for (uint32_t j = 0; j < nwin; j++) {
            uint32_t bit = j * wbits, w = bit >> 6, off = bit & 63;
            uint64_t v = s[w] >> off;
            if (off + wbits > 64 && w < 3) v |= s[w + 1] << (64 - off);
            uint32_t d = (uint32_t)(v & (full - 1)) + carry;
            bool neg = d > half;
            carry = neg;
            if (neg) d = full - d; /* 0 when d = 2^wbits: digit 0, carry 1 */
            if (d) {
                affine_t<F> p = affine_t<F>::load(table + (uint64_t)(j * half + d - 1) * AW);
                acc.add_affine(neg ? p.neg() : p);
            }
        }
        if (carry) acc.add_affine(affine_t<F>::load(table + (uint64_t)nwin * half * AW));
        fb_stash(acc, prod, scratch, i);
    }
    fb_to_affine(prod, scratch, out, i0, i1);
}

/* out[i] = 2^c src[i] (c >= 1) for the items [t per, (t + 1) per) of n: the affine
 * doubling, then c - 1 XYZZ doublings. src and out must not overlap. */
template <class F>
FF_INLINE void pow2_body(uint64_t t, const uint64_t* src, uint64_t* out, uint64_t* scratch, uint64_t n,
                         uint32_t per, uint32_t c) {
    const int AW = affine_t<F>::WORDS;
    uint64_t i0 = t * per, i1 = i0 + per < n ? i0 + per : n;
    F prod = F::one();
#pragma unroll 1
    for (uint64_t i = i0; i < i1; i++) {
        affine_t<F> p = affine_t<F>::load(src + i * AW);
        xyzz_t<F> acc = p.is_inf() ? xyzz_t<F>::inf() : xyzz_dbl_affine_call(p);
#pragma unroll 1
        for (uint32_t k = 1; k < c; k++) acc.dbl();
        fb_stash(acc, prod, scratch, i);
    }
    fb_to_affine(prod, scratch, out, i0, i1);
}
