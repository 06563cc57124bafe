/* Grid batch-affine rounds: the bucket accumulation's additions as affine + affine additions
 * that share ONE field inversion per round over the whole list (Montgomery's trick across the
 * device), then the XYZZ level 1 of accumulate.cuh over what the rounds leave.
 *
 * Why (the pair primitives are batch_affine.cuh's): an affine addition with its denominator's
 * inverse given costs 2M + 1S; the trick costs 3M per element, so an addition costs 5M + 1S
 * against the XYZZ mixed addition's 8M + 2S, and the accumulation is bound by the multiply
 * pipe. A block version (one inversion per block and round: measured, not kept) lost
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
 *   msm_ga_den    thread t of G takes slots t, t + G, ...: pref[s] = the product of the
 *                 denominators of its pairs up to slot s (non-pairs count 1); prods[t] = all of them;
 *   msm_ga_inv    prods -> their inverses (tree levels up, one inversion at the top, levels down);
 *   msm_ga_add    thread t walks its slots back: 1 / d_s = inv pref[s - G], then inv *= d_s, and
 *                 writes the pair's sum (ba_finish: P + P, P + (-P) and infinity operands too) or
 *                 copies the items.
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
    FF_INLINE F y(uint64_t i) const {
        const int CW = affine_t<F>::CW;
        if (!src.rows) return F::load(src.pts + i * affine_t<F>::WORDS + CW);
        uint64_t r = src.rows[i];
        F v = F::load(src.points + (r & ~MSM_ROW_NEG) * affine_t<F>::WORDS + CW);
        return (r & MSM_ROW_NEG) ? v.neg() : v;
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
        if (!ba_plain_add(xa, xb, d)) ba_kind(point(2 * s), point(2 * s + 1), d);
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

template <class F>
FF_INLINE void msm_ga_den_body(uint64_t t, uint64_t G, const ga_list<F>& L, uint64_t* pref, uint64_t* prods) {
    const int CW = field_words<F>::value;
    const uint64_t slots = (L.len + 1) / 2;
    F acc = F::one();
#pragma unroll 1
    for (uint64_t s = t; s < slots; s += G) {
        bool pair;
        L.count(s, pair);
        if (pair) acc = ba_mul(acc, L.den(s));
        acc.store(pref + s * CW);
    }
    acc.store(prods + t * CW);
}

template <class F>
FF_INLINE void msm_ga_add_body(uint64_t t, uint64_t G, const ga_list<F>& L, const int64_t* pos,
                               const uint64_t* pref, const uint64_t* inv_prods, uint64_t* out, uint32_t* out_bk) {
    const int CW = field_words<F>::value, AW = affine_t<F>::WORDS;
    if (t == 0) out_bk[-1] = L.src.bk[-1];
    const uint64_t slots = (L.len + 1) / 2;
    if (t >= slots) return;
    F inv = F::load(inv_prods + t * CW); /* 1 / (product of this thread's denominators up to slot s) */
    uint64_t s = t + (slots - 1 - t) / G * G;
#pragma unroll 1
    for (;;) {
        bool pair;
        uint64_t o = (uint64_t)pos[s] - L.count(s, pair);
        uint32_t b = L.bucket(2 * s);
        if (pair) {
            /* the ordinary addition (x1 != x2, neither 0) reads what it needs when it needs it, so
             * fewer values live across the products; the rest goes through ba_kind / ba_finish */
            F xa = L.x(2 * s), xb = L.x(2 * s + 1);
            F d = xb - xa;
            F ik = s >= G ? ba_mul(inv, F::load(pref + (s - G) * CW)) : inv;
            affine_t<F> r;
            if (ba_plain_add(xa, xb, d)) {
                inv = ba_mul(inv, d);
                F ya = L.y(2 * s);
                r = ba_from_slope(L.y(2 * s + 1) - ya, ik, xa, ya, xb);
            } else {
                affine_t<F> a = L.point(2 * s), c = L.point(2 * s + 1);
                F den;
                uint32_t kind = ba_kind(a, c, den);
                if (kind <= BA_DBL) inv = ba_mul(inv, den);
                r = ba_finish(kind, a, c, ik);
            }
            r.store(out + o * AW);
            out_bk[o] = b;
        } else {
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
        if (s < G) break;
        s -= G;
    }
}

/* Inverses of n non-zero field elements (vals, (n, CW) words) in place. One tree level: thread t
 * of g takes elements t, t + g, ...; up: pre = running products, prods[t] = the total; down
 * (prods holding the inverses of the totals by then): each element's inverse. The top: one thread,
 * Montgomery's trick over n elements and one inversion (ba_inv: the binary algorithm), in `total`. */
template <class F>
FF_INLINE void msm_ga_inv_up(uint64_t t, uint64_t g, uint64_t n, const uint64_t* vals, uint64_t* pre,
                             uint64_t* prods) {
    const int CW = field_words<F>::value;
    F acc = F::one();
#pragma unroll 1
    for (uint64_t s = t; s < n; s += g) {
        acc = ba_mul(acc, F::load(vals + s * CW));
        acc.store(pre + s * CW);
    }
    acc.store(prods + t * CW);
}

template <class F>
FF_INLINE void msm_ga_inv_down(uint64_t t, uint64_t g, uint64_t n, uint64_t* vals, const uint64_t* pre,
                               const uint64_t* prods) {
    const int CW = field_words<F>::value;
    if (t >= n) return;
    F inv = F::load(prods + t * CW);
    uint64_t s = t + (n - 1 - t) / g * g;
#pragma unroll 1
    for (;;) {
        F v = F::load(vals + s * CW);
        F r = s >= g ? ba_mul(inv, F::load(pre + (s - g) * CW)) : inv;
        inv = ba_mul(inv, v);
        r.store(vals + s * CW);
        if (s < g) break;
        s -= g;
    }
}

/* The top: one thread, the up and down levels with g = 1 around ONE inversion of the total. */
template <class F>
FF_INLINE void msm_ga_inv_top(uint64_t n, uint64_t* vals, uint64_t* pre, uint64_t* total) {
    msm_ga_inv_up<F>(0, 1, n, vals, pre, total);
    ba_inv_call(F::load(total)).store(total);
    msm_ga_inv_down<F>(0, 1, n, vals, pre, total);
}
