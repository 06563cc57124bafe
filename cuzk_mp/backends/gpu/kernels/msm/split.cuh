/* G2 level-1 accumulation with two lanes per segment ("component-split"): msm_level1_body's
 * segments over msm_entry_src, each summed by a PAIR of adjacent lanes. Lane c = threadIdx.x & 1
 * holds component c of every Fq2 value (the accumulator's X, Y, ZZ, ZZZ and the point's x, y),
 * so a lane carries G1-sized state and runs Fq arithmetic only.
 *
 * Why: the one-thread G2 kernel (msm_accumulate over xyzz_t<fp2_t>) needs 255 registers, ~1.1 KB
 * of call-save spills and 2 blocks of 128 per SM, and reaches ~70 % of its product floor, while
 * the G1 kernel (Fq state, Fq calls, fused Y3) reaches ~94 % (perf/gpu_msm_notes.md). With the
 * state split the pair's lanes look like G1 threads: ~G1 registers, more warps per SM, and every
 * Fq2 product one fused Fq product per lane.
 *
 * Fq2 = Fq[u] / (u^2 + 1), a = a0 + a1 u; a' = the partner lane's component (a shuffle):
 *   add / sub / neg / dbl   componentwise, no exchange;
 *   mul   c0 = a0 b0 - a1 b1, c1 = a1 b0 + a0 b1: lane 0 mul_add(a, b, -a', b'), lane 1
 *         mul_add(a, b', a', b), i.e. uniformly mul_add(a, sel(b', b), sel(a', -a'), sel(b, b'))
 *         with sel(odd lane, even lane): ONE Montgomery reduction for the two products
 *         (mont_t::mul_add, 444 instead of 600 32-bit products);
 *   sqr   c0 = (a0 + a1)(a0 - a1), c1 = 2 a0 a1: lane 0 (a + a')(a - a'), lane 1 (a + a) a':
 *         one Fq product per lane;
 *   Y3 = r s - y p (every formula's): four Fq products per lane with ONE reduction
 *         (fq_mul_add4, ff/fq_sum4.cuh: 732 products instead of 888 for two fused products).
 * (The lazy Karatsuba product split across the pair, 372 products a lane with one 24-word exchange,
 * was measured slower: its extra ALU carry chains cost more than the products it saves;
 * perf/gpu_msm_notes.md.)
 * The pair computes both candidates' operands with selects, so its control flow is uniform: no
 * even/odd divergence. Zero tests (the point at infinity, P == Q and P == -Q in the mixed
 * addition) hold for an Fq2 value when they hold on both lanes: split_both() votes over the pair,
 * so every branch is taken by both lanes or by neither (the exchanges below need both lanes).
 * The accumulator's infinity is a pair-uniform flag (its words are zero while it is set), so the
 * bucket step needs one vote (the point at infinity) and one more for P == +-Q.
 *
 * Products are __noinline__ calls with operands by value, as the G1 module's EC_FQ_CALLS (the
 * inlined products blow the instruction cache); the shuffles are inside the calls, so the loop
 * holds no exchange code but the votes.
 *
 * Storage is unchanged: each lane loads and stores its own component of the xyzz_t<fp2_t> and
 * affine_t<fp2_t> layouts (X c0, X c1, Y c0, ... , each Fq 6 uint64), so heads and buckets are read
 * by msm_combine and the bucket reduction as those of msm_accumulate.
 *
 * Exchanges: on the device __shfl_xor_sync / __all_sync over the pair's two-lane mask (pairs of a
 * warp may diverge from each other: the runs differ); in a host build (the kernel emulator,
 * tests/gpu_emu/prelude.h, which runs a block's threads as fibers) emu_pair_swap, which swaps a
 * few words with the partner fiber, waiting for it.
 */
#pragma once
#include "accumulate.cuh"
#include "../ff/fq_sum4.cuh"

#ifdef __CUDACC__
#define MSM_SPLIT_INLINE __device__ __forceinline__
#define MSM_SPLIT_CALL __device__ __noinline__
#else
#define MSM_SPLIT_INLINE inline
#define MSM_SPLIT_CALL inline
#endif
#ifndef __CUDA_ARCH__
/* Host builds: swaps w[0 .. n) with the same call of the partner lane (threadIdx.x ^ 1). */
extern "C" void emu_pair_swap(uint32_t* w, unsigned n);
#endif

/* x on odd lanes, y on even ones, word by word (a select, not a branch). */
MSM_SPLIT_INLINE fp_t split_sel(bool odd, const fp_t& x, const fp_t& y) {
    fp_t r;
#pragma unroll
    for (int i = 0; i < fp_t::N; i++) r.l[i] = odd ? x.l[i] : y.l[i];
    return r;
}

MSM_SPLIT_INLINE bool split_odd() { return threadIdx.x & 1; }

/* The partner lane's a. */
MSM_SPLIT_INLINE fp_t split_swap(const fp_t& a) {
    fp_t r;
#ifdef __CUDA_ARCH__
    const unsigned mask = 3u << (threadIdx.x & 30);
#pragma unroll
    for (int i = 0; i < fp_t::N; i++) r.l[i] = __shfl_xor_sync(mask, a.l[i], 1);
#else
    r = a;
    emu_pair_swap(r.l, fp_t::N);
#endif
    return r;
}

/* p on both lanes of the pair (the same answer on both). */
MSM_SPLIT_INLINE bool split_both(bool p) {
#ifdef __CUDA_ARCH__
    return __all_sync(3u << (threadIdx.x & 30), p);
#else
    uint32_t w = p;
    emu_pair_swap(&w, 1);
    return p && w;
#endif
}

/* This lane's component of a b in Fq2 (see the file comment). */
MSM_SPLIT_CALL fp_t split_mul_call(fp_t a, fp_t b) {
    const fp_t ap = split_swap(a), bp = split_swap(b);
    const bool odd = split_odd();
    return fp_t::mul_add(a, split_sel(odd, bp, b), split_sel(odd, ap, ap.neg()), split_sel(odd, b, bp));
}

/* This lane's component of r s - y p in Fq2 (the mixed addition's Y3), one reduction for the four
 * Fq products (ff/fq_sum4.cuh): lane 0 r s - r' s' - y p + y' p', lane 1 r s' + r' s - y' p - y p',
 * i.e. uniformly (r, sel(s', s)) + (sel(r', -r'), sel(s, s')) + (sel(-y', -y), p) + (sel(-y, y'), p'). */
MSM_SPLIT_CALL fp_t split_mul_sub_call(fp_t r, fp_t s, fp_t y, fp_t p) {
    const fp_t rp = split_swap(r), sp = split_swap(s), yp = split_swap(y), pp = split_swap(p);
    const bool odd = split_odd();
    const fp_t ny = y.neg();
    return fq_mul_add4(r, split_sel(odd, sp, s), split_sel(odd, rp, rp.neg()), split_sel(odd, s, sp),
                          split_sel(odd, yp.neg(), ny), p, split_sel(odd, ny, yp), pp);
}

/* This lane's component of a^2 in Fq2: (a + a')(a - a') on lane 0, (a + a) a' on lane 1. */
MSM_SPLIT_CALL fp_t split_sqr_call(fp_t a) {
    const fp_t ap = split_swap(a);
    const bool odd = split_odd();
    return (a + split_sel(odd, a, ap)) * split_sel(odd, ap, a - ap);
}

/* One lane's component of an XYZZ point over Fq2. */
struct split_xyzz {
    fp_t X, Y, ZZ, ZZZ;
};

/* mdbl-2008-s-1 (xyzz_t::dbl_affine) in split form: the double of the affine point (x, y). By
 * value, as xyzz.cuh's affine doubling (a reference would keep the caller's state in local memory). */
MSM_SPLIT_CALL split_xyzz split_dbl_affine_call(fp_t x, fp_t y) {
    fp_t U = y.dbl();
    fp_t V = split_sqr_call(U);
    fp_t W = split_mul_call(U, V);
    fp_t S = split_mul_call(x, V);
    fp_t M = split_sqr_call(x);
    M = M + M.dbl();
    fp_t X3 = split_sqr_call(M) - S.dbl();
    fp_t Y3 = split_mul_sub_call(M, S - X3, W, y);
    return {X3, Y3, V, W};
}

/* acc += (x, y) (madd-2008-s, xyzz_t::add_affine) in split form; `inf` is the accumulator's
 * infinity flag (pair-uniform; the words are zero while it is set). */
MSM_SPLIT_INLINE void split_add_affine(split_xyzz& acc, bool& inf, const fp_t& x, const fp_t& y) {
    if (split_both(x.is_zero() && y.is_zero())) return; /* the point at infinity */
    if (inf) {
        const fp_t one = split_sel(split_odd(), fp_t::zero(), fp_t::one()); /* 1 in Fq2 */
        acc = {x, y, one, one};
        inf = false;
        return;
    }
    fp_t P = split_mul_call(x, acc.ZZ) - acc.X;
    fp_t R = split_mul_call(y, acc.ZZZ) - acc.Y;
    if (split_both(P.is_zero())) {
        if (split_both(R.is_zero())) { /* the same point */
            acc = split_dbl_affine_call(x, y);
            inf = split_both(acc.ZZ.is_zero());
        } else { /* (x, y) = -acc */
            acc = {fp_t::zero(), fp_t::zero(), fp_t::zero(), fp_t::zero()};
            inf = true;
        }
        return;
    }
    fp_t PP = split_sqr_call(P);
    acc.ZZ = split_mul_call(acc.ZZ, PP);
    fp_t PPP = split_mul_call(P, PP);
    acc.ZZZ = split_mul_call(acc.ZZZ, PPP);
    fp_t Q = split_mul_call(acc.X, PP);
    acc.X = split_sqr_call(R) - PPP - Q.dbl();
    acc.Y = split_mul_sub_call(R, Q - acc.X, acc.Y, PPP);
}

/* One lane's share of a run's sum (msm_walk_segment's Acc, accumulate.cuh): this lane's component
 * of the XYZZ sum, mixed additions in split form, stores of this lane's words (msm_flush at level 1:
 * no add to the bucket), head_keys written by lane 0. */
struct split_acc {
    uint64_t* buckets;
    uint64_t* heads;
    uint32_t* head_keys;
    uint32_t lane;
    split_xyzz v;
    bool inf; /* the point at infinity (pair-uniform; the words are zero while it is set) */

    MSM_SPLIT_INLINE void reset() {
        v = {fp_t::zero(), fp_t::zero(), fp_t::zero(), fp_t::zero()};
        inf = true;
    }
    MSM_SPLIT_INLINE void add(const msm_entry_src<fp2_t>& src, uint64_t, uint64_t h) {
        const int AW = affine_t<fp2_t>::WORDS, CW = affine_t<fp2_t>::CW;
        const uint64_t* q = src.points +
                            msm_entry_row(h & ~MSM_ROW_NEG, src.m, src.per, src.stride, src.tail_idx) * AW +
                            lane * (CW / 2);
        fp_t x = fp_t::load(q), y = fp_t::load(q + CW);
        if (h & MSM_ROW_NEG) y = y.neg();
        split_add_affine(v, inf, x, y);
    }
    MSM_SPLIT_INLINE void flush(uint32_t b, bool to_head, uint64_t t) {
        const int XW = xyzz_t<fp2_t>::WORDS, CW = xyzz_t<fp2_t>::CW;
        uint64_t* dst = (to_head ? heads + t * XW : buckets + (uint64_t)b * XW) + lane * (CW / 2);
        v.X.store(dst);
        v.Y.store(dst + CW);
        v.ZZ.store(dst + 2 * CW);
        v.ZZZ.store(dst + 3 * CW);
        if (to_head && !lane) head_keys[t] = b;
    }
    MSM_SPLIT_INLINE bool writes_keys() const { return !lane; }
};

/* Segment t of level 1 (msm_level1_body over msm_entry_src<fp2_t>) by its pair, this lane's half. */
MSM_SPLIT_INLINE void msm_accumulate_split_body(uint64_t t, uint32_t lane, const int64_t* perm, const uint32_t* keys,
                                                const int64_t* tail_idx, const uint64_t* points, uint64_t* buckets,
                                                uint64_t* heads, uint32_t* head_keys, uint64_t n, uint64_t m,
                                                uint32_t cfg, uint64_t stride, uint32_t seg, uint64_t per) {
    const msm_entry_src<fp2_t> src = {perm, keys, tail_idx, points, m, stride, per, cfg};
    split_acc acc = {buckets, heads, head_keys, lane};
    msm_walk_segment(t, src, acc, head_keys, n, seg);
}
