/* Counting sort of a window batch's sort keys by bucket: what the accumulation needs (the
 * entries of one bucket contiguous, zero digits after them) in three fixed launches with no
 * host synchronisation, so an MSM can be captured into a CUDA graph. Entries of one bucket
 * come out in any order (the scatter's atomics decide); the accumulation does not care, since
 * an entry's sign and point come from its key and its position (accumulate.cuh).
 *
 * Zero digits (MSM_KEY_NONE) are not counted: a PoRep-like witness has them for ~40 % of its
 * scalars in every window, and one counter for all of them serialised the atomics. Instead
 * every perm slot first holds the sentinel position n, whose key (keys[n], one element past
 * the batch's keys) is MSM_KEY_NONE, and the scatter overwrites the first (non-zero entries)
 * slots: the accumulation stops at the first entry whose key is MSM_KEY_NONE, as after a sort.
 * The ones of a dense plan (all in bucket 0 of window 0) still meet on one counter, so a warp's
 * lanes of one bucket add to it once (msm_warp_claim).
 *
 *   msm_sort_count_one    perm[p] = n, keys[n] = NONE, counts[bucket(key p)] += 1;
 *   msm_sort_scan_body    counts -> exclusive prefix sums in place (one block);
 *   msm_sort_scatter_one  perm[offsets[bucket(key p)]++] = p.
 */
#pragma once
#include "digits.cuh"

/* counters[b] += 1 for this thread (when `live`), aggregated over the warp's lanes of the same
 * b (one atomic per bucket and warp); returns the counter's value before this thread's unit. */
FF_INLINE uint32_t msm_warp_claim(uint32_t* counters, uint32_t b, bool live) {
#ifdef __CUDA_ARCH__
    unsigned peers = __match_any_sync(__activemask(), live ? b : MSM_KEY_NONE);
    if (!live) return 0;
    unsigned lane = threadIdx.x & 31, leader = __ffs(peers) - 1, base = 0;
    if (lane == leader) base = atomicAdd(counters + b, (unsigned)__popc(peers));
    base = __shfl_sync(peers, base, leader);
    return base + __popc(peers & ((1u << lane) - 1));
#else
    return live ? atomicAdd(counters + b, 1u) : 0;
#endif
}

FF_INLINE void msm_sort_count_one(uint64_t p, uint32_t* keys, uint32_t* counts, int64_t* perm, uint64_t n,
                                  uint32_t cfg) {
    perm[p] = (int64_t)n;
    if (p == 0) keys[n] = MSM_KEY_NONE;
    uint32_t key = keys[p];
    msm_warp_claim(counts, msm_key_bucket(key, cfg), key != MSM_KEY_NONE);
}

FF_INLINE void msm_sort_scatter_one(uint64_t p, const uint32_t* keys, uint32_t* offsets, int64_t* perm,
                                    uint32_t cfg) {
    uint32_t key = keys[p];
    bool live = key != MSM_KEY_NONE;
    uint32_t slot = msm_warp_claim(offsets, msm_key_bucket(key, cfg), live);
    if (live) perm[slot] = (int64_t)p;
}

/* Exclusive prefix sums of counts[0 .. n) in place, by the one block of T threads: thread t
 * owns the contiguous range [t per, (t + 1) per); part[] (T entries of shared memory) holds
 * the ranges' totals, then their exclusive sums (thread 0 walks them). */
FF_INLINE void msm_sort_scan_body(uint32_t t, uint32_t T, uint32_t* counts, uint64_t n, uint32_t* part) {
    uint64_t per = (n + T - 1) / T, lo = t * per, hi = lo + per < n ? lo + per : n;
    uint32_t sum = 0;
#pragma unroll 1
    for (uint64_t i = lo; i < hi; i++) sum += counts[i];
    part[t] = sum;
    __syncthreads();
    if (t == 0) {
        uint32_t run = 0;
#pragma unroll 1
        for (uint32_t u = 0; u < T; u++) {
            uint32_t v = part[u];
            part[u] = run;
            run += v;
        }
    }
    __syncthreads();
    uint32_t run = part[t];
#pragma unroll 1
    for (uint64_t i = lo; i < hi; i++) {
        uint32_t v = counts[i];
        counts[i] = run;
        run += v;
    }
}
