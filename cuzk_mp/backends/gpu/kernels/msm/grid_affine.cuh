/* Grid batch-affine rounds: the bucket accumulation's additions as affine + affine additions
 * that share ONE field inversion per round over the whole list (Montgomery's trick across the
 * device), then the XYZZ level 1 of accumulate.cuh over what the rounds leave.
 *
 * Why: an affine addition with its denominator's inverse given costs 2M + 1S; the trick costs
 * 3M per element, so an addition costs 5M + 1S against the XYZZ mixed addition's 8M + 2S, and
 * the accumulation is bound by the multiply pipe. The block version (batch_affine.cuh) lost
 * because every block waits each round for one thread's inversion, and all blocks reach it
 * together. Here no kernel has a barrier and no thread waits for another: the waits are kernel
 * boundaries, and the one inversion of a round runs at the top of a tree of small launches.
 *
 * One round over a list of `len` items sorted by bucket (round 0: the sorted entries of a window
 * batch as point rows, msm_ga_rows; later rounds: the previous round's output):
 *   slot s holds items 2s and 2s + 1. It is a PAIR when both are real and share a bucket (one
 *   output: their sum); else each real item is copied (count(s) = 1 or 2; 0 past the list).
 *   Outputs are compacted in slot order, so the list stays sorted by bucket; a run of L items
 *   leaves about L / 2 + 1 of them.
 *   msm_ga_count  counts[s]; the host makes pos = their inclusive prefix sums (slot s's outputs
 *                 end at pos[s]; the last is the next round's length, which stays on the device:
 *                 the rounds enqueue without a host wait, over upper bounds of the lengths);
 *   msm_ga_den    a thread a slot: its denominator d_s (1 for a non-pair);
 *   msm_ga_inv    the d_s -> their inverses in place (batch inversion: a level of G threads with
 *                 chains of running products, a tree of smaller levels, ONE inversion at the top);
 *   msm_ga_sum    a thread a slot: the pair's sum (ba_finish: P + P, P + (-P) and infinity
 *                 operands too) or the copies of the items.
 * The passes that multiply in chains (the inversion's levels) are apart from those that do the
 * curve arithmetic, which run a thread per slot: no thread waits on a chain of dependent
 * products there, and the chains' kernels are small enough for many warps.
 * A list: msm_list_src (accumulate.cuh: point rows or affine points, bucket ids with bk[-1] =
 * the bucket before the list, which level 1's head rule needs) and its length, *len on the
 * device or len0 from the host (round 0).
 */
#pragma once
#include "batch_affine.cuh"

template <class F>
struct ga_list {
    msm_list_src<F> src;
    uint64_t len;

    FF_INLINE uint32_t bucket(uint64_t i) const { return i < len ? src.bk[i] : MSM_BUCKET_NONE; }
    FF_INLINE affine_t<F> point(uint64_t i) const { return src.point(i); }
    FF_INLINE F x(uint64_t i) const {
        if (!src.rows) return F::load(src.pts + i * affine_t<F>::WORDS);
        return F::load(src.points + (src.rows[i] & ~MSM_ROW_NEG) * affine_t<F>::WORDS);
    }
    /* outputs of slot s; pair: one sum */
    FF_INLINE uint32_t count(uint64_t s, bool& pair) const {
        uint32_t a = bucket(2 * s), b = bucket(2 * s + 1);
        pair = a != MSM_BUCKET_NONE && a == b;
        return pair ? 1u : (uint32_t)(a != MSM_BUCKET_NONE) + (uint32_t)(b != MSM_BUCKET_NONE);
    }
    /* a pair's denominator as ba_kind gives it, reading the x coordinates alone where they decide */
    FF_INLINE F den(uint64_t s) const {
        F xa = x(2 * s), xb = x(2 * s + 1);
        F d = xb - xa;
        if (d.is_zero() || xa.is_zero() || xb.is_zero()) ba_kind(point(2 * s), point(2 * s + 1), d);
        return d;
    }
};

template <class F>
FF_INLINE ga_list<F> ga_make_list(const uint64_t* points, const uint64_t* rows, const uint64_t* pts,
                                  const uint32_t* bk, const int64_t* len_ptr, uint64_t len0) {
    ga_list<F> L;
    L.src = {points, rows, pts, bk};
    L.len = len_ptr ? (uint64_t)*len_ptr : len0;
    return L;
}

/* Round 0's list from the sorted entries [j0, j0 + n) of a window batch: rows[i] = the point row
 * of entry j0 + i (MSM_ROW_NEG for a negative digit), bk[i] its bucket (MSM_BUCKET_NONE for a zero
 * digit); thread 0 also writes bk[-1], the bucket of entry j0 - 1. */
template <class F>
FF_INLINE void msm_ga_rows_one(uint64_t i, const msm_entry_src<F>& e, uint64_t j0, uint64_t* rows, uint32_t* bk) {
    if (i == 0) bk[-1] = e.bucket_before(j0);
    uint32_t b;
    uint64_t h;
    if (!e.head(j0 + i, b, h)) {
        bk[i] = MSM_BUCKET_NONE;
        rows[i] = 0;
        return;
    }
    uint64_t p = h & ~MSM_ROW_NEG;
    bk[i] = b;
    rows[i] = msm_entry_row(p, e.m, e.per, e.stride, e.tail_idx) | (h & MSM_ROW_NEG);
}

/* Slot s's denominator (1 where the slot is no pair or the pair needs no inversion). */
template <class F>
FF_INLINE void msm_ga_den_one(uint64_t s, const ga_list<F>& L, uint64_t* dens) {
    bool pair;
    L.count(s, pair);
    (pair ? L.den(s) : F::one()).store(dens + s * field_words<F>::value);
}

/* Slot s's outputs, at pos[s] - count(s): the pair's sum given inv = 1 / its denominator, or
 * the copies of its items. Thread 0 also carries bk[-1] over. */
template <class F>
FF_INLINE void msm_ga_sum_one(uint64_t s, const ga_list<F>& L, const int64_t* pos, const uint64_t* invs,
                              uint64_t* out, uint32_t* out_bk) {
    const int AW = affine_t<F>::WORDS;
    if (s == 0) out_bk[-1] = L.src.bk[-1];
    bool pair;
    uint64_t o = (uint64_t)pos[s] - L.count(s, pair);
    uint32_t b = L.bucket(2 * s);
    if (pair) {
        affine_t<F> a = L.point(2 * s), c = L.point(2 * s + 1);
        F den;
        uint32_t kind = ba_kind(a, c, den);
        ba_finish(kind, a, c, F::load(invs + s * field_words<F>::value)).store(out + o * AW);
        out_bk[o] = b;
        return;
    }
    if (b != MSM_BUCKET_NONE) {
        L.point(2 * s).store(out + o * AW);
        out_bk[o++] = b;
    }
    uint32_t b2 = L.bucket(2 * s + 1);
    if (b2 != MSM_BUCKET_NONE) {
        L.point(2 * s + 1).store(out + o * AW);
        out_bk[o] = b2;
    }
}

/* Inverses of n non-zero field elements (vals, (n, CW) words) in place. One tree level: thread t
 * of g takes elements t, t + g, t + 2g, ... as GA_ILP interleaved chains (element k of the thread
 * in chain k mod GA_ILP); up: pre = each chain's running products, prods[j g + t] = chain j's
 * total; down (prods holding the inverses of the totals by then): each element's inverse. A
 * chain is a run of dependent products, so one chain a thread leaves the multiplier waiting on
 * each product's latency; GA_ILP independent ones in one unrolled step let the scheduler overlap
 * them (the products are inline here, not the formulas' calls). The top: one thread,
 * Montgomery's trick over n elements and one inversion (ba_inv: the binary algorithm). */
#ifndef GA_ILP
#define GA_ILP 4
#endif

template <class F>
FF_INLINE void msm_ga_inv_up(uint64_t t, uint64_t g, uint64_t n, const uint64_t* vals, uint64_t* pre,
                             uint64_t* prods) {
    const int CW = field_words<F>::value;
    F acc[GA_ILP];
#pragma unroll
    for (int j = 0; j < GA_ILP; j++) acc[j] = F::one();
#pragma unroll 1
    for (uint64_t k0 = 0; t + k0 * g < n; k0 += GA_ILP) {
        F v[GA_ILP];
#pragma unroll
        for (int j = 0; j < GA_ILP; j++) {
            uint64_t s = t + (k0 + j) * g;
            v[j] = s < n ? F::load(vals + s * CW) : F::one();
        }
#pragma unroll
        for (int j = 0; j < GA_ILP; j++) acc[j] = acc[j] * v[j];
#pragma unroll
        for (int j = 0; j < GA_ILP; j++) {
            uint64_t s = t + (k0 + j) * g;
            if (s < n) acc[j].store(pre + s * CW);
        }
    }
#pragma unroll
    for (int j = 0; j < GA_ILP; j++) acc[j].store(prods + (j * g + t) * CW);
}

template <class F>
FF_INLINE void msm_ga_inv_down(uint64_t t, uint64_t g, uint64_t n, uint64_t* vals, const uint64_t* pre,
                               const uint64_t* prods) {
    const int CW = field_words<F>::value;
    if (t >= n) return;
    F inv[GA_ILP];
#pragma unroll
    for (int j = 0; j < GA_ILP; j++) inv[j] = F::load(prods + (j * g + t) * CW);
    const uint64_t last = (n - 1 - t) / g; /* the thread's last element index k */
#pragma unroll 1
    for (int64_t k0 = (int64_t)(last / GA_ILP * GA_ILP); k0 >= 0; k0 -= GA_ILP) {
        F v[GA_ILP], p[GA_ILP], r[GA_ILP];
#pragma unroll
        for (int j = 0; j < GA_ILP; j++) {
            uint64_t k = (uint64_t)k0 + j, s = t + k * g;
            v[j] = s < n ? F::load(vals + s * CW) : F::one();
            p[j] = k0 > 0 && s < n ? F::load(pre + (s - GA_ILP * g) * CW) : F::one();
        }
#pragma unroll
        for (int j = 0; j < GA_ILP; j++) r[j] = inv[j] * p[j];
#pragma unroll
        for (int j = 0; j < GA_ILP; j++) inv[j] = inv[j] * v[j];
#pragma unroll
        for (int j = 0; j < GA_ILP; j++) {
            uint64_t s = t + ((uint64_t)k0 + j) * g;
            if (s < n) r[j].store(vals + s * CW);
        }
    }
}

template <class F>
FF_INLINE void msm_ga_inv_top(uint64_t n, uint64_t* vals, uint64_t* pre) {
    const int CW = field_words<F>::value;
    F acc = F::one();
#pragma unroll 1
    for (uint64_t i = 0; i < n; i++) {
        acc = ba_mul(acc, F::load(vals + i * CW));
        acc.store(pre + i * CW);
    }
    F inv = ba_inv_call(acc);
#pragma unroll 1
    for (uint64_t i = n; i-- > 0;) {
        F v = F::load(vals + i * CW);
        F r = i ? ba_mul(inv, F::load(pre + (i - 1) * CW)) : inv;
        inv = ba_mul(inv, v);
        r.store(vals + i * CW);
    }
}
