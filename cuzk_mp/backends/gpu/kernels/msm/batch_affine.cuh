/* Affine + affine additions with the denominator's inverse given: the pair primitives of the
 * grid batch-affine rounds (grid_affine.cuh).
 *
 * Why: an affine addition P + Q needs lambda = (yQ - yP) / (xQ - xP); with the inverse of
 * the denominator given it costs 2M + 1S, and Montgomery's trick turns K inversions into
 * one inversion plus 3 (K - 1) multiplications. So each addition costs 5M + 1S, against
 * 8M + 2S for the XYZZ mixed addition of msm_accumulate: ~40 % fewer multiplies per
 * bucket addition, paid for in memory traffic (perf/gpu_msm_notes.md). Here: the kind of a
 * pair (P + Q, P + P, an operand at infinity, P + (-P)) with its denominator, the sum from
 * the slope, and the one inversion a round makes (the binary algorithm: its latency is what
 * the round waits for). A block-cooperative version, one inversion per block and round, lost
 * to the grid rounds and to XYZZ on the H200 and is not kept (perf/gpu_msm_notes.md).
 */
#pragma once
#include "../ff/inv_binary.cuh"
#include "accumulate.cuh"

#define BA_ADD 0u    /* x1 != x2: lambda = (y2 - y1) / (x2 - x1) */
#define BA_DBL 1u    /* P + P, y != 0: lambda = 3 x^2 / (2 y) */
#define BA_TAKE_B 2u /* the first operand is infinity */
#define BA_TAKE_A 3u /* the second operand is infinity */
#define BA_INF 4u    /* P + (-P) (or a 2-torsion double): infinity */

/* A round's one inversion (by a single thread while the others wait: latency is what
 * counts): the binary algorithm of ff/inv_binary.cuh; Fq2 through the norm, (c0 - c1 u) / (c0^2 + c1^2). */
FF_INLINE fp_t ba_inv(const fp_t& a) { return inv_binary(a); }
FF_INLINE fp2_t ba_inv(const fp2_t& a) {
    fp_t t = inv_binary(a.c0.sqr() + a.c1.sqr());
    return {a.c0 * t, (a.c1 * t).neg()};
}
template <class F>
EC_NOINLINE F ba_inv_call(F a) {
    return ba_inv(a);
}

/* The products are the curve formulas' (ec_mul / ec_sqr): calls in both MSM modules (EC_FQ_CALLS
 * for G1, EC_FP2_CALLS for G2), so the rounds' kernels stay small (gpu_msm_notes.md). */
template <class F>
FF_INLINE F ba_mul(const F& a, const F& b) {
    return ec_mul(a, b);
}
template <class F>
FF_INLINE F ba_sqr(const F& a) {
    return ec_sqr(a);
}
/* The kind of pair (a, b) and its denominator (1 where the pair needs no inversion). */
template <class F>
FF_INLINE uint32_t ba_kind(const affine_t<F>& a, const affine_t<F>& b, F& den) {
    den = F::one();
    if (a.is_inf()) return BA_TAKE_B;
    if (b.is_inf()) return BA_TAKE_A;
    F dx = b.x - a.x;
    if (!dx.is_zero()) {
        den = dx;
        return BA_ADD;
    }
    if (a.y == b.y && !a.y.is_zero()) {
        den = a.y.dbl();
        return BA_DBL;
    }
    return BA_INF;
}

/* Whether x alone decides the pair: x1 != x2 (den = x2 - x1), neither 0 (x = 0 may be
 * infinity's encoding); then the pair is BA_ADD with that den, else ba_kind decides. */
template <class F>
FF_INLINE bool ba_plain_add(const F& xa, const F& xb, const F& den) {
    return !den.is_zero() && !xa.is_zero() && !xb.is_zero();
}

/* The sum from the slope l = num / den: x3 = l^2 - xa - xb, y3 = l (xa - x3) - ya. 2M + 1S. */
template <class F>
FF_INLINE affine_t<F> ba_from_slope(const F& num, const F& inv, const F& xa, const F& ya, const F& xb) {
    F l = ba_mul(num, inv);
    F x3 = ba_sqr(l) - xa - xb;
    return {x3, ba_mul(l, xa - x3) - ya};
}

/* a + b given inv = 1 / den of ba_kind. */
template <class F>
FF_INLINE affine_t<F> ba_finish(uint32_t kind, const affine_t<F>& a, const affine_t<F>& b, const F& inv) {
    if (kind == BA_TAKE_B) return b;
    if (kind == BA_TAKE_A) return a;
    if (kind == BA_INF) return affine_t<F>::inf();
    F num;
    if (kind == BA_ADD) {
        num = b.y - a.y;
    } else {
        F xx = ba_sqr(a.x);
        num = xx + xx.dbl();
    }
    return ba_from_slope(num, inv, a.x, a.y, b.x);
}
