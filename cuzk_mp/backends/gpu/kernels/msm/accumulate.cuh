/* Bucket accumulation over the sorted digit keys: segmented, so any key distribution
 * (one huge bucket or 2^c tiny ones) gives every thread the same amount of work.
 *
 * Level 1 (msm_accumulate_body). The sorted entries of a window batch are cut into
 * segments of `seg` consecutive entries, one thread each. Entry j is position
 * p = perm[j] of the batch's key array: key = keys[p], bucket from the key (digits.cuh,
 * cfg), local window wl = p / m, scalar i = p - wl m, point row wl stride + tail_idx[i]
 * (or + i mod per, see msm_entry_row; stride = 0 without precomputed multiples, else the
 * rows between two multiples, the host passing the batch's first multiple). A thread adds its
 * entries run by run (a run = consecutive entries of one bucket) into an XYZZ
 * accumulator with mixed additions, negating the point for a negative digit, and
 * flushes each run when the bucket changes:
 *   - a run that started in an earlier segment (only the segment's first run can)
 *     goes to heads[t] with its bucket id in head_keys[t];
 *   - every other run started here, so this thread is the only one that starts that
 *     bucket: it STORES it to buckets[b] (the host zeroes buckets first).
 * Segments without such a head get head_keys[t] = MSM_BUCKET_NONE.
 *
 * Level k >= 2 (msm_combine_body): the (heads, head_keys) list is again sorted by
 * bucket, and all heads of one bucket are contiguous (a bucket that spans segments
 * t1 < t2 spans every segment between, and each of those has it as a head), so the
 * same segmented pass runs over it, skipping MSM_BUCKET_NONE entries; runs that it
 * owns are ADDED to buckets[b] (which may hold the level-1 owner's part). The host
 * repeats levels until one segment covers the whole list.
 */
#pragma once
#include "../ec/xyzz.cuh"
#include "digits.cuh"

template <class F>
FF_INLINE void msm_flush(xyzz_t<F>& acc, uint32_t b, bool to_head, bool add_to_bucket, uint64_t t,
                         uint64_t* buckets, uint64_t* heads, uint32_t* head_keys) {
    const int XW = xyzz_t<F>::WORDS;
    if (to_head) {
        acc.store(heads + t * XW);
        head_keys[t] = b;
        return;
    }
    uint64_t* dst = buckets + (uint64_t)b * XW;
    if (add_to_bucket) acc.add(xyzz_t<F>::load(dst));
    acc.store(dst);
}

/* Where level 1 reads its sorted entries, in two steps as the loop needs them: head(j, b, h) reads entry j's bucket (false at the first
 * zero digit: they sort last) and a handle h for point(j, h), its signed point, which the loop
 * loads only after it flushed the previous run; bucket_before(j0) is the bucket of the entry
 * before j0 (MSM_BUCKET_NONE if none).
 *   msm_entry_src: the digit keys of a window batch (key = keys[perm[j]], its point row from
 *                  msm_entry_row);
 *   msm_list_src:  a list left by the grid batch-affine rounds (grid_affine.cuh): item j is the
 *                  point row rows[j] of `points` (bit 63: negated) or, with rows null, the
 *                  affine point pts[j]; its bucket bk[j], and bk[-1] the bucket before the list. */
#define MSM_ROW_NEG (1ull << 63) /* a handle's / a list row's "negate the point" bit */

template <class F>
struct msm_entry_src {
    const int64_t* perm;
    const uint32_t* keys;
    const int64_t* tail_idx;
    const uint64_t* points;
    uint64_t m, stride, per;
    uint32_t cfg;

    FF_INLINE uint32_t bucket_before(uint64_t j0) const {
        if (!j0) return MSM_BUCKET_NONE;
        uint32_t k = keys[perm[j0 - 1]];
        return k == MSM_KEY_NONE ? MSM_BUCKET_NONE : msm_key_bucket(k, cfg);
    }
    FF_INLINE bool head(uint64_t j, uint32_t& b, uint64_t& h) const {
        uint64_t p = (uint64_t)perm[j];
        uint32_t key = keys[p];
        if (key == MSM_KEY_NONE) return false;
        b = msm_key_bucket(key, cfg);
        h = p | ((key & 1) ? MSM_ROW_NEG : 0);
        return true;
    }
    FF_INLINE affine_t<F> point(uint64_t, uint64_t h) const {
        uint64_t p = h & ~MSM_ROW_NEG;
        affine_t<F> pt = affine_t<F>::load(points + msm_entry_row(p, m, per, stride, tail_idx) * affine_t<F>::WORDS);
        return (h & MSM_ROW_NEG) ? pt.neg() : pt;
    }
};

template <class F>
struct msm_list_src {
    const uint64_t* points;
    const uint64_t* rows;
    const uint64_t* pts;
    const uint32_t* bk;

    FF_INLINE uint32_t bucket_before(uint64_t j0) const { return bk[(int64_t)j0 - 1]; }
    FF_INLINE affine_t<F> point(uint64_t j, uint64_t = 0) const {
        if (!rows) return affine_t<F>::load(pts + j * affine_t<F>::WORDS);
        uint64_t r = rows[j];
        affine_t<F> pt = affine_t<F>::load(points + (r & ~MSM_ROW_NEG) * affine_t<F>::WORDS);
        return (r & MSM_ROW_NEG) ? pt.neg() : pt;
    }
    FF_INLINE bool head(uint64_t j, uint32_t& b, uint64_t& h) const {
        b = bk[j];
        h = 0;
        return b != MSM_BUCKET_NONE;
    }
};

/* The segment walk of level 1: segment t (entries [t seg, t seg + seg) of n) of `src`, in runs
 * of one bucket, each summed by `acc` and flushed when the bucket changes (see the file comment:
 * the segment's first run to heads[t] when it started in an earlier segment, any other run to its
 * bucket). Acc, the bucket sum of one thread's share of a run:
 *   reset()                          start a run (the point at infinity);
 *   add(src, j, h)                   add entry j (its handle h from src.head);
 *   flush(b, to_head, t)             store the run's sum (to_head: to heads[t], head_keys[t] = b);
 *   writes_keys()                    whether this thread writes head_keys (one per segment). */
template <class Src, class Acc>
FF_INLINE void msm_walk_segment(uint64_t t, const Src& src, Acc& acc, uint32_t* head_keys, uint64_t n,
                                uint32_t seg) {
    uint64_t j0 = t * seg, j1 = j0 + seg < n ? j0 + seg : n;
    const uint32_t prev = src.bucket_before(j0);
    uint32_t cur = MSM_BUCKET_NONE;
    bool first = true, wrote_head = false;
    acc.reset();
#pragma unroll 1
    for (uint64_t j = j0; j < j1; j++) {
        uint32_t b;
        uint64_t h;
        if (!src.head(j, b, h)) break; /* zero digits sort last */
        if (b != cur) {
            if (cur != MSM_BUCKET_NONE) {
                bool head = first && cur == prev;
                acc.flush(cur, head, t);
                wrote_head |= head;
                first = false;
            }
            cur = b;
            acc.reset();
        }
        acc.add(src, j, h);
    }
    if (cur != MSM_BUCKET_NONE) {
        bool head = first && cur == prev;
        acc.flush(cur, head, t);
        wrote_head |= head;
    }
    if (!wrote_head && acc.writes_keys()) head_keys[t] = MSM_BUCKET_NONE;
}

/* One thread's XYZZ sum of a run (msm_walk_segment's Acc): mixed additions of src's points. */
template <class F>
struct msm_xyzz_acc {
    uint64_t* buckets;
    uint64_t* heads;
    uint32_t* head_keys;
    xyzz_t<F> v;

    FF_INLINE void reset() { v = xyzz_t<F>::inf(); }
    template <class Src>
    FF_INLINE void add(const Src& src, uint64_t j, uint64_t h) { v.add_affine(src.point(j, h)); }
    FF_INLINE void flush(uint32_t b, bool to_head, uint64_t t) {
        msm_flush(v, b, to_head, false, t, buckets, heads, head_keys);
    }
    FF_INLINE bool writes_keys() const { return true; }
};

/* Segment t of level 1, from `src`, one thread. */
template <class F, class Src>
FF_INLINE void msm_level1_body(uint64_t t, const Src& src, uint64_t* buckets, uint64_t* heads,
                               uint32_t* head_keys, uint64_t n, uint32_t seg) {
    msm_xyzz_acc<F> acc = {buckets, heads, head_keys, xyzz_t<F>::inf()};
    msm_walk_segment(t, src, acc, head_keys, n, seg);
}

template <class F>
FF_INLINE void msm_accumulate_body(uint64_t t, const int64_t* perm, const uint32_t* keys,
                                   const int64_t* tail_idx, const uint64_t* points, uint64_t* buckets,
                                   uint64_t* heads, uint32_t* head_keys, uint64_t n, uint64_t m,
                                   uint32_t cfg, uint64_t stride, uint32_t seg, uint64_t per) {
    const msm_entry_src<F> src = {perm, keys, tail_idx, points, m, stride, per, cfg};
    msm_level1_body<F>(t, src, buckets, heads, head_keys, n, seg);
}

template <class F>
FF_INLINE void msm_combine_body(uint64_t t, const uint64_t* in_pts, const uint32_t* in_keys,
                                uint64_t* buckets, uint64_t* heads, uint32_t* head_keys, uint64_t n,
                                uint32_t seg) {
    const int XW = xyzz_t<F>::WORDS;
    uint64_t j0 = t * seg, j1 = j0 + seg < n ? j0 + seg : n;
    uint32_t prev = t ? in_keys[j0 - 1] : MSM_BUCKET_NONE;
    uint32_t cur = MSM_BUCKET_NONE;
    bool first = true, wrote_head = false;
    xyzz_t<F> acc = xyzz_t<F>::inf();
#pragma unroll 1
    for (uint64_t j = j0; j < j1; j++) {
        uint32_t b = in_keys[j];
        if (b == MSM_BUCKET_NONE) continue;
        if (b != cur) {
            if (cur != MSM_BUCKET_NONE) {
                bool head = first && cur == prev;
                msm_flush(acc, cur, head, true, t, buckets, heads, head_keys);
                wrote_head |= head;
                first = false;
            }
            cur = b;
            acc = xyzz_t<F>::inf();
        }
        acc.add(xyzz_t<F>::load(in_pts + j * XW));
    }
    if (cur != MSM_BUCKET_NONE) {
        bool head = first && cur == prev;
        msm_flush(acc, cur, head, true, t, buckets, heads, head_keys);
        wrote_head |= head;
    }
    if (!wrote_head) head_keys[t] = MSM_BUCKET_NONE;
}
