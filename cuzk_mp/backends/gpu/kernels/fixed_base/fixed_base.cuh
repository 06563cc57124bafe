/* Batch fixed-base scalar multiplication s_i * G with a precomputed window table,
 * results in affine zkey layout (the dev setup's workload: millions of s_i, one G).
 *
 * Table (built on the host, uploaded once): FB_NWIN = 32 unsigned 8-bit windows,
 * row j * 255 + d - 1 holds d 2^(8 j) G (affine, zkey layout), so
 * s G = sum_j table[j][byte_j(s)] over the non-zero bytes: at most 32 mixed XYZZ
 * additions, no doublings, and any 256-bit s works (s mod r follows from G's order).
 *
 * Affine output by Montgomery's trick per thread: a thread makes `per` consecutive
 * points, keeping each XYZZ sum and the running product of the ZZZ's in `scratch`;
 * one inversion of the product gives every 1/ZZZ_i on the way back, and since
 * ZZ^3 = ZZZ^2, 1/ZZ_i = (ZZ_i / ZZZ_i)^2: x = X (ZZ/ZZZ)^2, y = Y / ZZZ. Cost per
 * point ~ 32 x (8M + 2S) + 3M (trick) + 4M (affine) + 1/per inversion.
 * A zero scalar (or a sum that is infinity) stores the all-zero point.
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
FF_INLINE void fixed_base_body(uint64_t t, const uint64_t* scalars, const uint64_t* table, uint64_t* out,
                               uint64_t* scratch, uint64_t n, uint32_t per) {
    const int AW = affine_t<F>::WORDS, XW = xyzz_t<F>::WORDS, CW = xyzz_t<F>::CW, SW = XW + CW;
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
        if (!acc.is_inf()) prod = prod * acc.ZZZ;
        acc.store(scratch + i * SW);
        prod.store(scratch + i * SW + XW);
    }
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
