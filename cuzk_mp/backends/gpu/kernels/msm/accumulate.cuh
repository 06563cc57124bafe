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

template <class F>
FF_INLINE void msm_accumulate_body(uint64_t t, const int64_t* perm, const uint32_t* keys,
                                   const int64_t* tail_idx, const uint64_t* points, uint64_t* buckets,
                                   uint64_t* heads, uint32_t* head_keys, uint64_t n, uint64_t m,
                                   uint32_t cfg, uint64_t stride, uint32_t seg, uint64_t per) {
    const int AW = affine_t<F>::WORDS;
    uint64_t j0 = t * seg, j1 = j0 + seg < n ? j0 + seg : n;
    uint32_t prev = MSM_BUCKET_NONE;
    if (t) {
        uint32_t k = keys[perm[j0 - 1]];
        if (k != MSM_KEY_NONE) prev = msm_key_bucket(k, cfg);
    }
    uint32_t cur = MSM_BUCKET_NONE;
    bool first = true, wrote_head = false;
    xyzz_t<F> acc = xyzz_t<F>::inf();
#pragma unroll 1
    for (uint64_t j = j0; j < j1; j++) {
        uint64_t p = (uint64_t)perm[j];
        uint32_t key = keys[p];
        if (key == MSM_KEY_NONE) break; /* zero digits sort last */
        uint32_t b = msm_key_bucket(key, cfg);
        if (b != cur) {
            if (cur != MSM_BUCKET_NONE) {
                bool head = first && cur == prev;
                msm_flush(acc, cur, head, false, t, buckets, heads, head_keys);
                wrote_head |= head;
                first = false;
            }
            cur = b;
            acc = xyzz_t<F>::inf();
        }
        affine_t<F> pt = affine_t<F>::load(points + msm_entry_row(p, m, per, stride, tail_idx) * AW);
        acc.add_affine((key & 1) ? pt.neg() : pt);
    }
    if (cur != MSM_BUCKET_NONE) {
        bool head = first && cur == prev;
        msm_flush(acc, cur, head, false, t, buckets, heads, head_keys);
        wrote_head |= head;
    }
    if (!wrote_head) head_keys[t] = MSM_BUCKET_NONE;
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
