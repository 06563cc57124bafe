/* Counting sort of a window batch's sort keys by bucket: what the accumulation needs (the
 * entries of one bucket contiguous, zero digits last) in three fixed launches with no host
 * synchronisation, so an MSM can be captured into a CUDA graph. Entries of one bucket come
 * out in any order (the scatter's atomics decide); the accumulation does not care, since
 * an entry's sign and point come from its key and its position (accumulate.cuh).
 *
 * Bins: bucket id (msm_key_bucket) in [0, bins), and bin `bins` for MSM_KEY_NONE.
 *   msm_sort_count_one    counts[bin(key p)] += 1 for every position p;
 *   msm_sort_scan_body    counts -> exclusive prefix sums in place (one block);
 *   msm_sort_scatter_one  perm[offsets[bin(key p)]++] = p.
 */
#pragma once
#include "digits.cuh"

FF_INLINE uint32_t msm_sort_bin(uint32_t key, uint32_t cfg, uint32_t bins) {
    return key == MSM_KEY_NONE ? bins : msm_key_bucket(key, cfg);
}

FF_INLINE void msm_sort_count_one(uint64_t p, const uint32_t* keys, uint32_t* counts, uint32_t cfg,
                                  uint32_t bins) {
    atomicAdd(counts + msm_sort_bin(keys[p], cfg, bins), 1u);
}

FF_INLINE void msm_sort_scatter_one(uint64_t p, const uint32_t* keys, uint32_t* offsets, int64_t* perm,
                                    uint32_t cfg, uint32_t bins) {
    uint32_t slot = atomicAdd(offsets + msm_sort_bin(keys[p], cfg, bins), 1u);
    perm[slot] = (int64_t)p;
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
