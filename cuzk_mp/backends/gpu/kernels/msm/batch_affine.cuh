/* Batch-affine bucket accumulation: the level-1 pass of accumulate.cuh with affine + affine
 * additions that share one field inversion per block and round (Montgomery's trick).
 *
 * Why: an affine addition P + Q needs lambda = (yQ - yP) / (xQ - xP); with the inverse of
 * the denominator given it costs 2M + 1S, and Montgomery's trick turns K inversions into
 * one inversion plus 3 (K - 1) multiplications. So each addition costs 5M + 1S, against
 * 8M + 2S for the XYZZ mixed addition of msm_accumulate: ~40 % fewer multiplies per
 * bucket addition. The price is memory traffic (the batch lives in global memory between
 * its two passes) and one inversion per block and round.
 *
 * Work split: as msm_accumulate, the sorted entries of a window batch are cut into
 * segments of `seg` entries, one per thread, and every run (consecutive entries of one
 * bucket) of a segment is summed; the run sums are flushed exactly as there (accumulate.cuh:
 * the run of the bucket the previous segment ended with goes to heads[t], every other run
 * is owned and STORED to its bucket), so the combine levels and the reduction are unchanged.
 * Summing a segment's runs, per thread:
 *   round r = 0 .. rounds - 1 (the list is the segment's entries, then the thread's scratch):
 *     den pass, last item to first: in each run, items are paired from the run's end
 *       ((L-2, L-1), (L-4, L-3), ...; the first item of an odd run stays single); each
 *       pair's denominator d_k (x2 - x1; 2 y1 for P + P; 1 where no inversion is needed:
 *       an operand at infinity, P + (-P)) is multiplied into a running product and the
 *       suffix products s_k = d_k d_(k+1) ... are stored in scratch (this pass reads the
 *       x coordinates alone unless they are equal or zero);
 *     the block inverts the product of all its threads' products at once
 *       (ba_block_inverse: prefix and suffix scans in shared memory, ONE inversion by
 *       thread 0, the binary algorithm: its latency is what the block waits for), which hands each thread the inverse of its own product;
 *     out pass, first item to last: pair k's inverse is inv s_(k+1), then inv *= d_k
 *       (inv is then 1 / s_(k+1)); the sum is written compacted to the front of the
 *       scratch list (never past what is still to be read). A run that gives ONE item
 *       this round (length 1 or 2) is complete: it is flushed at once instead.
 *   then the runs left (each halved `rounds` times) are summed with XYZZ mixed additions.
 * Each round halves every run; the last rounds have few pairs per block inversion, so
 * `rounds` (host: MsmParams.ba_rounds) stops where the inversion would cost more than the
 * XYZZ additions it replaces.
 *
 * Grid: persistent. gridDim.x blocks of B threads walk the virtual blocks of B segments
 * (vb = blockIdx.x, + gridDim.x, ...); every thread of a block takes part in each round's
 * block inversion, also where it has no segment (it contributes 1). Scratch, per physical
 * thread g of G = gridDim.x B, word-major so that a warp's accesses are contiguous:
 *   points  cap = ba_cap(seg) affine points, word w of item k at pts[(k AW + w) G + g]
 *           (a run of L >= 3 leaves ceil(L / 2) <= 2 L / 3 items; shorter runs are flushed);
 *   suffix  half = ba_half(seg) field elements, word w of s_k at suf[(k CW + w) G + g];
 *   keys    cap bucket ids (uint32), item k at keys[k G + g].
 * The host sizes it from the same two functions (msm.py).
 */
#pragma once
#include "../ff/inv_binary.cuh"
#include "accumulate.cuh"

#define BA_ADD 0u    /* x1 != x2: lambda = (y2 - y1) / (x2 - x1) */
#define BA_DBL 1u    /* P + P, y != 0: lambda = 3 x^2 / (2 y) */
#define BA_TAKE_B 2u /* the first operand is infinity */
#define BA_TAKE_A 3u /* the second operand is infinity */
#define BA_INF 4u    /* P + (-P) (or a 2-torsion double): infinity */

FF_INLINE uint64_t ba_cap(uint64_t seg) { return seg >= 3 ? 2 * seg / 3 : 1; }
FF_INLINE uint64_t ba_half(uint64_t seg) { return seg >= 2 ? seg / 2 : 1; }

/* The block's one inversion (by a single thread while the others wait: latency is what
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

/* The kernel's products are the curve formulas' (ec_mul / ec_sqr): calls in both MSM modules
 * (EC_FQ_CALLS for G1, EC_FP2_CALLS for G2), and the XYZZ tail's mixed addition is one call too:
 * inlined, the den pass, the out pass, the block inversion and the XYZZ tail made 261 KB of SASS
 * (16 720 instructions) that alternate within every block (gpu_msm_notes.md). */
template <class F>
FF_INLINE F ba_mul(const F& a, const F& b) {
    return ec_mul(a, b);
}
template <class F>
FF_INLINE F ba_sqr(const F& a) {
    return ec_sqr(a);
}
template <class F>
EC_NOINLINE xyzz_t<F> ba_add_affine_call(xyzz_t<F> acc, affine_t<F> p) {
    acc.add_affine(p);
    return acc;
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

/* One field element spread over `stride`-apart words (the scratch layout). */
template <class F>
FF_INLINE F ba_load(const uint64_t* p, uint64_t stride) {
    uint64_t w[field_words<F>::value];
#pragma unroll
    for (int i = 0; i < field_words<F>::value; i++) w[i] = p[(uint64_t)i * stride];
    return F::load(w);
}
template <class F>
FF_INLINE void ba_store(const F& x, uint64_t* p, uint64_t stride) {
    uint64_t w[field_words<F>::value];
    x.store(w);
#pragma unroll
    for (int i = 0; i < field_words<F>::value; i++) p[(uint64_t)i * stride] = w[i];
}

/* A thread's list: the segment's sorted entries (round 0) or its scratch items. */
template <class F>
struct ba_list {
    static constexpr int CW = field_words<F>::value;
    static constexpr int AW = 2 * CW;
    /* the entries */
    const int64_t* perm;
    const uint32_t* keys;
    const int64_t* tail_idx;
    const uint64_t* points;
    uint64_t j0, m, stride, per;
    uint32_t cfg;
    /* this thread's column of the scratch (already offset by g) */
    uint64_t* pts;
    uint64_t* suf;
    uint32_t* skeys;
    uint64_t G;
    bool entries; /* read the entries (round 0) or the scratch items */

    FF_INLINE uint32_t key(uint64_t i) const {
        return entries ? msm_key_bucket(keys[perm[j0 + i]], cfg) : skeys[i * G];
    }
    /* the key of entry i and the point row it reads */
    FF_INLINE const uint64_t* entry(uint64_t i, uint32_t& k) const {
        uint64_t p = (uint64_t)perm[j0 + i];
        k = keys[p];
        return points + msm_entry_row(p, m, per, stride, tail_idx) * AW;
    }
    FF_INLINE affine_t<F> pt(uint64_t i) const {
        if (!entries) {
            const uint64_t* p = pts + i * AW * G;
            return {ba_load<F>(p, G), ba_load<F>(p + CW * G, G)};
        }
        uint32_t k;
        affine_t<F> a = affine_t<F>::load(entry(i, k));
        return (k & 1) ? a.neg() : a;
    }
    /* x alone (the den pass reads y only where x cannot decide the pair's kind) */
    FF_INLINE F x(uint64_t i) const {
        if (!entries) return ba_load<F>(pts + i * AW * G, G);
        uint32_t k;
        return F::load(entry(i, k));
    }
    FF_INLINE void put(uint64_t i, const affine_t<F>& a, uint32_t b) const {
        uint64_t* p = pts + i * AW * G;
        ba_store(a.x, p, G);
        ba_store(a.y, p + CW * G, G);
        skeys[i * G] = b;
    }
    FF_INLINE F suffix(uint64_t k) const { return ba_load<F>(suf + k * CW * G, G); }
    FF_INLINE void set_suffix(uint64_t k, const F& x) const { ba_store(x, suf + k * CW * G, G); }
};

/* Where a finished run goes: heads[t] for the bucket the previous segment ended with, else
 * stored to its bucket (accumulate.cuh's rule: only a segment's first run can be that one). */
template <class F>
struct ba_flusher {
    uint64_t t;
    uint32_t prev;
    uint64_t* buckets;
    uint64_t* heads;
    uint32_t* head_keys;
    bool wrote_head;

    FF_INLINE void flush(xyzz_t<F>& acc, uint32_t b) {
        bool head = b == prev;
        msm_flush(acc, b, head, false, t, buckets, heads, head_keys);
        wrote_head |= head;
    }
};

/* Den pass (last item to first): the number of pairs; acc = product of their denominators. */
template <class F>
FF_INLINE uint32_t ba_den_pass(const ba_list<F>& L, uint64_t len, F& acc) {
    uint32_t np = 0;
    acc = F::one();
    int64_t i = (int64_t)len - 1;
    uint32_t kb = L.key((uint64_t)i);
#pragma unroll 1
    while (i >= 1) {
        uint32_t ka = L.key((uint64_t)(i - 1));
        if (ka != kb) {
            i -= 1;
            kb = ka;
            continue;
        }
        F xa = L.x((uint64_t)(i - 1)), xb = L.x((uint64_t)i);
        F den = xb - xa;
        if (!ba_plain_add(xa, xb, den)) ba_kind(L.pt((uint64_t)(i - 1)), L.pt((uint64_t)i), den);
        acc = ba_mul(acc, den); /* den = 1 where the pair needs no inversion */
        L.set_suffix(np++, acc); /* suffix of the np-th pair from the end */
        i -= 2;
        if (i >= 0) kb = L.key((uint64_t)i);
    }
    return np;
}

/* Out pass (first item to last): the new list length. inv = 1 / (this thread's product). */
template <class F>
FF_INLINE uint64_t ba_out_pass(ba_list<F>& L, uint64_t len, uint32_t np, F inv, ba_flusher<F>& fl) {
    uint64_t i = 0, o = 0;
    uint32_t k = 0;
#pragma unroll 1
    while (i < len) {
        uint32_t b = L.key(i);
        uint64_t end = i + 1;
        while (end < len && L.key(end) == b) end++;
        bool done = end - i <= 2; /* one item out: the run is complete */
#pragma unroll 1
        while (i < end) {
            affine_t<F> r;
            if ((end - i) & 1) { /* the single first item of an odd run */
                r = L.pt(i);
                i += 1;
            } else {
                affine_t<F> a = L.pt(i), c = L.pt(i + 1);
                F den;
                uint32_t kind = ba_kind(a, c, den);
                /* 1 / d_k = inv * s_(k+1); s_(k+1) is stored as the (np - 2 - k)-th from the end */
                F ik = k + 1 < np ? ba_mul(inv, L.suffix(np - 2 - k)) : inv;
                if (kind <= BA_DBL) inv = ba_mul(inv, den);
                r = ba_finish(kind, a, c, ik);
                i += 2;
                k++;
            }
            if (done) {
                xyzz_t<F> acc = xyzz_t<F>::from_affine(r);
                fl.flush(acc, b);
            } else {
                L.put(o++, r, b); /* o <= the first item not yet read */
            }
        }
    }
    return o;
}

/* The inverse of x for every thread of the block, with ONE inversion: thread t gets
 * 1 / x_t = (1 / prod_s x_s) * prod_(s < t) x_s * prod_(s > t) x_s. Every x_t must be
 * non-zero. All B threads must call it (barriers). */
template <class F, int B>
DEV_INLINE F ba_block_inverse(const F& x) {
    __shared__ F pre[B], post[B], total;
    const uint32_t t = threadIdx.x;
    pre[t] = x;
    post[t] = x;
    __syncthreads();
#pragma unroll 1
    for (uint32_t d = 1; d < (uint32_t)B; d <<= 1) { /* inclusive scans: prefix and suffix products */
        F a = pre[t], s = post[t];
        if (t >= d) a = ba_mul(pre[t - d], a);
        if (t + d < (uint32_t)B) s = ba_mul(s, post[t + d]);
        __syncthreads();
        pre[t] = a;
        post[t] = s;
        __syncthreads();
    }
    if (t == 0) total = ba_inv_call(pre[B - 1]);
    __syncthreads();
    F r = total;
    if (t > 0) r = ba_mul(r, pre[t - 1]);
    if (t + 1 < (uint32_t)B) r = ba_mul(r, post[t + 1]);
    __syncthreads(); /* the next call rewrites the arrays */
    return r;
}

template <class F, int B>
DEV_INLINE void msm_accumulate_affine_body(const int64_t* perm, const uint32_t* keys, const int64_t* tail_idx,
                                           const uint64_t* points, uint64_t* buckets, uint64_t* heads,
                                           uint32_t* head_keys, uint64_t n, uint64_t m, uint32_t cfg,
                                           uint64_t stride, uint32_t seg, uint64_t* scratch, uint64_t per) {
    const uint32_t rounds = cfg >> 16;
    cfg &= 0xffff;
    const uint64_t G = (uint64_t)gridDim.x * B, g = (uint64_t)blockIdx.x * B + threadIdx.x;
    const uint64_t cap = ba_cap(seg), half = ba_half(seg);
    ba_list<F> L;
    L.perm = perm;
    L.keys = keys;
    L.tail_idx = tail_idx;
    L.points = points;
    L.m = m;
    L.stride = stride;
    L.per = per;
    L.cfg = cfg;
    L.G = G;
    L.pts = scratch + g;
    L.suf = scratch + cap * ba_list<F>::AW * G + g;
    L.skeys = (uint32_t*)(scratch + (cap * ba_list<F>::AW + half * ba_list<F>::CW) * G) + g;
    const uint64_t nseg = (n + seg - 1) / seg, nvb = (nseg + B - 1) / B;
#pragma unroll 1
    for (uint64_t vb = blockIdx.x; vb < nvb; vb += gridDim.x) { /* uniform across the block */
        const uint64_t t = vb * B + threadIdx.x;
        const bool active = t < nseg;
        uint64_t len = 0;
        ba_flusher<F> fl = {t, MSM_BUCKET_NONE, buckets, heads, head_keys, false};
        if (active) {
            uint64_t j0 = t * seg, j1 = j0 + seg < n ? j0 + seg : n;
            while (j1 > j0 && keys[perm[j1 - 1]] == MSM_KEY_NONE) j1--; /* zero digits sort last */
            len = j1 - j0;
            L.j0 = j0;
            if (t) {
                uint32_t k = keys[perm[j0 - 1]];
                if (k != MSM_KEY_NONE) fl.prev = msm_key_bucket(k, cfg);
            }
        }
        L.entries = true;
#pragma unroll 1
        for (uint32_t r = 0; r < rounds; r++) {
            F acc = F::one();
            uint32_t np = 0;
            if (len) np = ba_den_pass(L, len, acc);
            F inv = ba_block_inverse<F, B>(acc);
            if (len) len = ba_out_pass(L, len, np, inv, fl);
            L.entries = false;
        }
        if (active) {
            /* the runs left: XYZZ mixed additions over the list (the entries if rounds == 0) */
            uint32_t cur = MSM_BUCKET_NONE;
            xyzz_t<F> acc = xyzz_t<F>::inf();
#pragma unroll 1
            for (uint64_t i = 0; i < len; i++) {
                uint32_t b = L.key(i);
                if (b != cur) {
                    if (cur != MSM_BUCKET_NONE) fl.flush(acc, cur);
                    cur = b;
                    acc = xyzz_t<F>::inf();
                }
                acc = ba_add_affine_call(acc, L.pt(i));
            }
            if (cur != MSM_BUCKET_NONE) fl.flush(acc, cur);
            if (!fl.wrote_head) head_keys[t] = MSM_BUCKET_NONE;
        }
    }
}
