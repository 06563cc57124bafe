/* xyzz_t<F>: a point in extended Jacobian "XYZZ" coordinates, the bucket type of the MSM.
 *
 * (X, Y, ZZ, ZZZ) stands for the affine point (X / ZZ, Y / ZZZ) with ZZ^3 = ZZZ^2
 * (ZZ = Z^2, ZZZ = Z^3 for some Z); ZZ = 0 is the point at infinity. Formulas are
 * the EFD's "xyzz" set for short Weierstrass curves with a = 0 (both BLS12-381
 * groups): madd-2008-s (8M + 2S), add-2008-s (12M + 2S), dbl-2008-s-1 (6M + 3S),
 * mdbl-2008-s-1 (4M + 3S), each with the exceptional cases the bucket sums meet:
 * either operand at infinity, P + P (falls back to doubling) and P + (-P) (gives
 * infinity). Storage: X, Y, ZZ, ZZZ consecutively, 4 * CW uint64 words.
 * Statement order is register pressure: the field code is `asm volatile` PTX, which
 * the compiler does not move, so each ZZ / ZZZ update comes as soon as its factor
 * exists and every temporary dies as early as the formula allows.
 *
 * Inlining: only the mixed addition (the accumulation's inner loop) is inlined.
 * Doubling and the full addition are __noinline__ device functions: one copy per
 * module instead of one per call site, which cut the G1 module's ptxas time from
 * minutes to seconds and removed register spills in the bucket reduction; their
 * callers (reduction, combine levels) spend ~8000 instructions per call, so the
 * call overhead (operands through local memory) is small. (Passing those by value
 * instead was tried: msm_reduce went from 146 to 255 registers on G1 and to 4 KB
 * of spills on G2.) The mixed addition's rare P + P case calls the affine doubling
 * BY VALUE: a reference would take the address of the accumulator and the point,
 * and NVVM then keeps both in local memory for the whole loop (seen in SASS: ~170
 * local loads/stores per G2 bucket step, 66 per G1 step; by value: ~30 and ~8).
 */
#pragma once
#include "affine.cuh"
#include "../ff/fp2_lazy.cuh"

#ifdef __CUDACC__
#define EC_NOINLINE __host__ __device__ __noinline__
#else
#define EC_NOINLINE
#endif

/* The products of the curve formulas go through ec_mul / ec_sqr, so that the G2 MSM
 * module can choose how its Fq2 products are compiled (-D knobs, MsmParams in msm.py):
 * EC_FP2_CALLS
 *   0  inline (default): each Fq2 product is ~1000 SASS instructions in place, so one
 *      G2 mixed addition is ~13.6 k instructions (~220 KB of code per bucket step);
 *   1  Fq2 mul and sqr are __noinline__ calls (one body of each per kernel, shared by
 *      every formula): about as many instructions executed, ~3 x less code per step
 *      (~70 KB), the G2 module compiles in ~4 s instead of ~55 s, but the caller's live
 *      values are saved around each call (local memory; ptxas's calling convention).
 * EC_FP2_LAZY
 *   0  Fq2 mul is fp2_t's (default);  1  fp2_lazy::mul (fp2_lazy.cuh: Karatsuba on
 *      double-width products, two Montgomery reductions instead of three).
 * Which wins depends on the instruction cache and the register budget and is
 * measured on the device (perf/gpu_msm_notes.md). G1 (fp_t) chooses with EC_FQ_CALLS below. */
#ifndef EC_FP2_CALLS
#define EC_FP2_CALLS 0
#endif
#ifndef EC_FP2_LAZY
#define EC_FP2_LAZY 0
#endif
#if (EC_FP2_CALLS != 0 && EC_FP2_CALLS != 1) || (EC_FP2_LAZY != 0 && EC_FP2_LAZY != 1)
#error "EC_FP2_CALLS and EC_FP2_LAZY must be 0 or 1"
#endif

FF_INLINE fp2_t ec_fp2_mul(const fp2_t& a, const fp2_t& b) {
#if EC_FP2_LAZY
    return fp2_lazy::mul(a, b);
#else
    return a * b;
#endif
}
template <class F>
FF_INLINE F ec_mul(const F& a, const F& b) {
    return a * b;
}
template <class F>
FF_INLINE F ec_sqr(const F& a) {
    return a.sqr();
}
/* EC_FQ_CALLS=1 (G1 modules): every Fq product, square and fused
 * a b - c d of every formula is a __noinline__ call taking its operands BY VALUE, as
 * EC_FP2_CALLS does for G2: ~600-instruction bodies once per kernel instead of at each of
 * the mixed addition's ten products, so one bucket step runs through about a third of the
 * code. Why: the inlined G1 accumulation spends ~30 % of its warp samples on "no
 * instruction" stalls (Nsight Compute, H200, perf/gpu_msm_notes.md). */
#ifndef EC_FQ_CALLS
#define EC_FQ_CALLS 0
#endif
#if EC_FQ_CALLS != 0 && EC_FQ_CALLS != 1
#error "EC_FQ_CALLS must be 0 or 1"
#endif
#if EC_FQ_CALLS
EC_NOINLINE fp_t ec_fq_mul_call(fp_t a, fp_t b) {
    return a * b;
}
EC_NOINLINE fp_t ec_fq_sqr_call(fp_t a) {
    return a.sqr();
}
template <>
FF_INLINE fp_t ec_mul<fp_t>(const fp_t& a, const fp_t& b) {
    return ec_fq_mul_call(a, b);
}
template <>
FF_INLINE fp_t ec_sqr<fp_t>(const fp_t& a) {
    return ec_fq_sqr_call(a);
}
#ifndef EC_FQ_FUSED
#define EC_FQ_FUSED 0
#endif
#if EC_FQ_FUSED
EC_NOINLINE fp_t ec_fq_mul_sub_call(fp_t a, fp_t b, fp_t c, fp_t d) {
    return fp_t::mul_add(a, b, c.neg(), d);
}
#endif
#endif
/* a b - c d, the Y3 of every formula. EC_FQ_FUSED=1 (G1): one
 * Montgomery reduction for both products (mont_t::mul_add with -c); otherwise two products. */
#ifndef EC_FQ_FUSED
#define EC_FQ_FUSED 0
#endif
template <class F>
FF_INLINE F ec_mul_sub(const F& a, const F& b, const F& c, const F& d) {
    return ec_mul(a, b) - ec_mul(c, d);
}
#if EC_FQ_FUSED
template <>
FF_INLINE fp_t ec_mul_sub<fp_t>(const fp_t& a, const fp_t& b, const fp_t& c, const fp_t& d) {
#if EC_FQ_CALLS
    return ec_fq_mul_sub_call(a, b, c, d);
#else
    return fp_t::mul_add(a, b, c.neg(), d);
#endif
}
#endif
#if EC_FP2_CALLS
EC_NOINLINE fp2_t ec_fp2_mul_call(fp2_t a, fp2_t b) {
    return ec_fp2_mul(a, b);
}
EC_NOINLINE fp2_t ec_fp2_sqr_call(fp2_t a) {
    return a.sqr();
}
template <>
FF_INLINE fp2_t ec_mul<fp2_t>(const fp2_t& a, const fp2_t& b) {
    return ec_fp2_mul_call(a, b);
}
template <>
FF_INLINE fp2_t ec_sqr<fp2_t>(const fp2_t& a) {
    return ec_fp2_sqr_call(a);
}
#else
template <>
FF_INLINE fp2_t ec_mul<fp2_t>(const fp2_t& a, const fp2_t& b) {
    return ec_fp2_mul(a, b);
}
#endif

template <class F>
struct xyzz_t;
template <class F>
EC_NOINLINE void xyzz_dbl_call(xyzz_t<F>& p);
template <class F>
EC_NOINLINE void xyzz_add_call(xyzz_t<F>& p, const xyzz_t<F>& q);
template <class F>
EC_NOINLINE xyzz_t<F> xyzz_dbl_affine_call(affine_t<F> p);

template <class F>
struct xyzz_t {
    F X, Y, ZZ, ZZZ;
    static constexpr int CW = field_words<F>::value;
    static constexpr int WORDS = 4 * CW;

    FF_INLINE static xyzz_t inf() { return {F::zero(), F::zero(), F::zero(), F::zero()}; }
    FF_INLINE bool is_inf() const { return ZZ.is_zero(); }
    FF_INLINE static xyzz_t from_affine(const affine_t<F>& p) {
        if (p.is_inf()) return inf();
        return {p.x, p.y, F::one(), F::one()};
    }
    FF_INLINE static xyzz_t load(const uint64_t* p) {
        return {F::load(p), F::load(p + CW), F::load(p + 2 * CW), F::load(p + 3 * CW)};
    }
    FF_INLINE void store(uint64_t* p) const {
        X.store(p);
        Y.store(p + CW);
        ZZ.store(p + 2 * CW);
        ZZZ.store(p + 3 * CW);
    }
    FF_INLINE void neg_in_place() { Y = Y.neg(); }

    /* dbl-2008-s-1 with a = 0: U = 2Y, V = U^2, W = U V, S = X V, M = 3 X^2,
     * X3 = M^2 - 2S, Y3 = M (S - X3) - W Y, ZZ3 = V ZZ, ZZZ3 = W ZZZ. 6M + 3S.
     * Y = 0 gives V = 0, hence ZZ3 = 0 (infinity), as it must. */
    FF_INLINE void dbl() { xyzz_dbl_call(*this); }
    FF_INLINE void dbl_inline() {
        if (is_inf()) return;
        F U = Y.dbl();
        F V = ec_sqr(U);
        F W = ec_mul(U, V);
        ZZ = ec_mul(V, ZZ);
        ZZZ = ec_mul(W, ZZZ);
        F S = ec_mul(X, V);
        F M = ec_sqr(X);
        M = M + M.dbl();
        X = ec_sqr(M) - S.dbl();
        Y = ec_mul_sub(M, S - X, W, Y);
    }

    /* mdbl-2008-s-1: the double of an affine point (ZZ = ZZZ = 1). 4M + 3S. */
    FF_INLINE static xyzz_t dbl_affine(const affine_t<F>& p) {
        F U = p.y.dbl();
        F V = ec_sqr(U);
        F W = ec_mul(U, V);
        F S = ec_mul(p.x, V);
        F M = ec_sqr(p.x);
        M = M + M.dbl();
        F X3 = ec_sqr(M) - S.dbl();
        F Y3 = ec_mul_sub(M, S - X3, W, p.y);
        return {X3, Y3, V, W};
    }

    /* this += p, p affine (madd-2008-s): U2 = X2 ZZ1, S2 = Y2 ZZZ1, P = U2 - X1,
     * R = S2 - Y1, PP = P^2, PPP = P PP, Q = X1 PP, X3 = R^2 - PPP - 2Q,
     * Y3 = R (Q - X3) - Y1 PPP, ZZ3 = ZZ1 PP, ZZZ3 = ZZZ1 PPP. 8M + 2S. */
    FF_INLINE void add_affine(const affine_t<F>& p) {
        if (p.is_inf()) return;
        if (is_inf()) {
            *this = from_affine(p);
            return;
        }
        F P = ec_mul(p.x, ZZ) - X;
        F R = ec_mul(p.y, ZZZ) - Y;
        if (P.is_zero()) {
            if (R.is_zero()) *this = xyzz_dbl_affine_call(p); /* same point */
            else *this = inf();                    /* p = -this */
            return;
        }
        F PP = ec_sqr(P);
        ZZ = ec_mul(ZZ, PP);
        F PPP = ec_mul(P, PP);
        ZZZ = ec_mul(ZZZ, PPP);
        F Q = ec_mul(X, PP);
        X = ec_sqr(R) - PPP - Q.dbl();
        Y = ec_mul_sub(R, Q - X, Y, PPP);
    }

    /* this += q (add-2008-s): U1 = X1 ZZ2, U2 = X2 ZZ1, S1 = Y1 ZZZ2, S2 = Y2 ZZZ1,
     * P = U2 - U1, R = S2 - S1, PP = P^2, PPP = P PP, Q = U1 PP,
     * X3 = R^2 - PPP - 2Q, Y3 = R (Q - X3) - S1 PPP, ZZ3 = ZZ1 ZZ2 PP,
     * ZZZ3 = ZZZ1 ZZZ2 PPP. 12M + 2S. */
    FF_INLINE void add(const xyzz_t& q) { xyzz_add_call(*this, q); }
    FF_INLINE void add_inline(const xyzz_t& q) {
        if (q.is_inf()) return;
        if (is_inf()) {
            *this = q;
            return;
        }
        F U1 = ec_mul(X, q.ZZ);
        F S1 = ec_mul(Y, q.ZZZ);
        F P = ec_mul(q.X, ZZ) - U1;
        F R = ec_mul(q.Y, ZZZ) - S1;
        if (P.is_zero()) {
            if (R.is_zero()) dbl();
            else *this = inf();
            return;
        }
        F PP = ec_sqr(P);
        ZZ = ec_mul(ec_mul(ZZ, q.ZZ), PP);
        F PPP = ec_mul(P, PP);
        ZZZ = ec_mul(ec_mul(ZZZ, q.ZZZ), PPP);
        F Q = ec_mul(U1, PP);
        X = ec_sqr(R) - PPP - Q.dbl();
        Y = ec_mul_sub(R, Q - X, S1, PPP);
    }

    /* this * e for a small e (double-and-add, MSB first); e = 0 gives infinity. */
    FF_INLINE xyzz_t mul_small(uint32_t e) const {
        xyzz_t r = inf();
        int top = 31;
        while (top >= 0 && !((e >> top) & 1)) top--;  /* the doublings of infinity skipped */
#pragma unroll 1
        for (int bit = top; bit >= 0; bit--) {
            r.dbl();
            if ((e >> bit) & 1) r.add(*this);
        }
        return r;
    }
};

template <class F>
EC_NOINLINE void xyzz_dbl_call(xyzz_t<F>& p) {
    p.dbl_inline();
}
template <class F>
EC_NOINLINE void xyzz_add_call(xyzz_t<F>& p, const xyzz_t<F>& q) {
    p.add_inline(q);
}
template <class F>
EC_NOINLINE xyzz_t<F> xyzz_dbl_affine_call(affine_t<F> p) {
    return xyzz_t<F>::dbl_affine(p);
}
