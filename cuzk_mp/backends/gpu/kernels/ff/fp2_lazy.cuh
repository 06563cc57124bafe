/* Fq2 multiplication with lazy reduction: Karatsuba on double-width products and two
 * Montgomery reductions instead of three (a G2-MSM variant, EC_FP2_LAZY in xyzz.cuh).
 *
 * fp2_t::operator* (ff/fp2.cuh) runs three full Montgomery products (CIOS: 12 x 12
 * products for a * b and 12 x 12 for the reduction each, ~300 IMADs). Here:
 *   t0 = a0 b0, t1 = a1 b1, t2 = (a0 + a1)(b0 + b1)   as 24-word integers (144 IMADs each),
 *   c0 = REDC(t0 - t1 (+ p R if negative)),  c1 = REDC(t2 - t0 - t1)   (156 IMADs each),
 * 744 IMADs instead of ~900 (8 of the 10 Fq2 products of a G2 mixed addition are muls).
 * Bounds (p < 2^381, R = 2^384): a0 + a1 < 2p is used unreduced, so t2 < 4p^2 < 2^768;
 * t0 - t1 is in (-p^2, p^2), and adding p R when it borrowed puts it in [0, p R), so its
 * high half is below p; t2 - t0 - t1 = a0 b1 + a1 b0 < 2p^2 has a high half below p / 4.
 * REDC(lo half) <= p (mont.cuh's sqr bound), so REDC(lo) + hi < 2p and one conditional
 * subtraction makes the result canonical, exactly as fp_t::sqr() finishes.
 *
 * The double-width products are fp_t's (mont.cuh: mul_wide), as are
 * the reduction and the final subtraction (fp_t::redc_wide, the tail fp_t::sqr() shares).
 */
#pragma once
#include "fp2.cuh"

namespace fp2_lazy {

constexpr int N = fp_t::N;  /* 32-bit words of an Fq element */

/* r = a + b without reduction (a, b < p, so r < 2p < 2^(32 N)). */
FF_INLINE void add_raw(uint32_t* r, const uint32_t* a, const uint32_t* b) {
    ptx::cc_t cc;
    r[0] = ptx::add_cc(a[0], b[0], cc);
#pragma unroll
    for (int i = 1; i < N - 1; i++) r[i] = ptx::addc_cc(a[i], b[i], cc);
    r[N - 1] = ptx::addc(a[N - 1], b[N - 1], cc);
}

/* w (2N words) = a b for a, b < 2^(32 N - 1): fp_t's schoolbook wide product (mont.cuh). */
FF_INLINE void mul_wide(uint32_t* w, const uint32_t* a, const uint32_t* b) { fp_t::mul_wide<N>(w, a, b); }

/* r = a - b over 2N words; returns all ones when it borrowed. */
FF_INLINE uint32_t sub_wide(uint32_t* r, const uint32_t* a, const uint32_t* b) {
    ptx::cc_t cc;
    r[0] = ptx::sub_cc(a[0], b[0], cc);
#pragma unroll
    for (int k = 1; k < 2 * N; k++) r[k] = ptx::subc_cc(a[k], b[k], cc);
    return ptx::subc(0, 0, cc);
}

/* w += p R masked by `mask` (words N .. 2N), mod 2^(64 N). */
FF_INLINE void add_pr(uint32_t* w, uint32_t mask) {
    ptx::cc_t cc;
    w[N] = ptx::add_cc(w[N], fq_field::mod(0) & mask, cc);
#pragma unroll
    for (int i = 1; i < N - 1; i++) w[N + i] = ptx::addc_cc(w[N + i], fq_field::mod(i) & mask, cc);
    w[2 * N - 1] = ptx::addc(w[2 * N - 1], fq_field::mod(N - 1) & mask, cc);
}


/* r = a + b over 2N words (callers keep the sum below 2^(64 N)). */
FF_INLINE void add_wide(uint32_t* r, const uint32_t* a, const uint32_t* b) {
    ptx::cc_t cc;
    r[0] = ptx::add_cc(a[0], b[0], cc);
#pragma unroll
    for (int k = 1; k < 2 * N - 1; k++) r[k] = ptx::addc_cc(a[k], b[k], cc);
    r[2 * N - 1] = ptx::addc(a[2 * N - 1], b[2 * N - 1], cc);
}

/* a b in Fq2 (u^2 = -1), canonical in, canonical out. Order keeps at most ~108 words
 * of temporaries: c0 is reduced before the third product starts. */
FF_INLINE fp2_t mul(const fp2_t& a, const fp2_t& b) {
    uint32_t t0[2 * N], t1[2 * N], s[2 * N];
    mul_wide(t0, a.c0.l, b.c0.l);
    mul_wide(t1, a.c1.l, b.c1.l);
    add_wide(s, t0, t1);                   /* a0 b0 + a1 b1 < 2 p^2 */
    add_pr(t0, sub_wide(t0, t0, t1));      /* a0 b0 - a1 b1 (+ p R): in [0, p R) */
    fp2_t r;
    r.c0 = fp_t::redc_wide(t0);
    uint32_t sa[N], sb[N];
    add_raw(sa, a.c0.l, a.c1.l);
    add_raw(sb, b.c0.l, b.c1.l);
    mul_wide(t0, sa, sb);                  /* (a0 + a1)(b0 + b1) < 4 p^2 */
    sub_wide(t0, t0, s);                   /* a0 b1 + a1 b0: no borrow */
    r.c1 = fp_t::redc_wide(t0);
    return r;
}

}  // namespace fp2_lazy
