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

/* ------------------------------------------------------------------ radix sort
 * The LSD radix sort of a window batch too large for the counting sort: the positions of the n
 * keys, stable, ordered by their low `bits` bits (the host picks bits so that MSM_KEY_NONE's low
 * bits exceed every real key: zero digits last). Only the bits a batch's keys use are sorted (24
 * for 2 windows of 22 bits, against 32 for a generic sort) and positions are 32-bit until the
 * last pass writes the int64 permutation: ~56 bytes of traffic a key for 3 passes.
 *
 * A pass over digit (key >> shift) & (2^dbits - 1), dbits <= MSM_RADIX_MAX_BITS, is two launches
 * over the same tiles of MSM_RADIX_TILE keys (block b: keys [b TILE, (b + 1) TILE); warp w of the
 * block owns the tile's w-th run of MSM_RADIX_ITEMS x 32 keys, element w ITEMS 32 + k 32 + lane in
 * its round k: warps in order, rounds in order, lanes in order = key order):
 *   msm_radix_hist     counts[d nblocks + b] = keys of tile b with digit d (digit-major, so the
 *                      host's exclusive scan of counts gives every (digit, tile) its first slot);
 *   msm_radix_scatter  ranks each key of the tile stably within the tile in three steps with two
 *                      block barriers in all: (1) each warp ranks its own keys, round by round,
 *                      against a warp-private count per digit in shared memory (a round's peers
 *                      of one digit by __match_any_sync, the count updated by their lowest lane:
 *                      no block barrier); (2) one exclusive scan over (digit, warp) in
 *                      digit-major order turns the counts into each warp's first slot of each
 *                      digit in the sorted tile; (3) every key goes to its slot in shared memory,
 *                      and the sorted tile is written out in order: the keys of one digit leave as
 *                      one contiguous run (coalesced), at offsets[d nblocks + b] onwards.
 * The previous form ranked a round of the whole block at a time (three block barriers a round,
 * 48 a tile). On the host (the kernel emulator) threads run one at a time between barriers, so
 * the warp ranks are counted from a shared copy of the tile's digits instead. */
#ifndef MSM_RADIX_THREADS
#define MSM_RADIX_THREADS 256
#endif
#define MSM_RADIX_ITEMS 16
#define MSM_RADIX_TILE (MSM_RADIX_THREADS * MSM_RADIX_ITEMS)
#define MSM_RADIX_MAX_BITS 9
#define MSM_RADIX_BINS (1u << MSM_RADIX_MAX_BITS)
#define MSM_RADIX_WARPS (MSM_RADIX_THREADS / 32)
#define MSM_RADIX_WARP_KEYS (MSM_RADIX_ITEMS * 32)
#if MSM_RADIX_BINS % MSM_RADIX_THREADS != 0 || MSM_RADIX_TILE > 65535
#error "MSM_RADIX_THREADS must divide MSM_RADIX_BINS; slots of a tile must fit 16 bits"
#endif

struct msm_radix_shared {
    uint32_t keys[MSM_RADIX_TILE];  /* the tile sorted by digit */
    uint32_t vals[MSM_RADIX_TILE];
    uint16_t wc[MSM_RADIX_WARPS][MSM_RADIX_BINS]; /* a warp's keys of each digit, then its first slot */
    uint32_t delta[MSM_RADIX_BINS]; /* global offset of a digit's run minus its tile offset */
    uint32_t scan[MSM_RADIX_THREADS];
#ifndef __CUDA_ARCH__
    uint16_t digit[MSM_RADIX_TILE]; /* the emulator's view of the tile's digits */
#endif
};

FF_INLINE uint32_t msm_radix_digit(uint32_t key, uint32_t shift, uint32_t dbits) {
    return (key >> shift) & ((1u << dbits) - 1);
}

/* Block b's histogram of digit (shift, dbits) over its tile, into counts (digit-major). */
FF_INLINE void msm_radix_hist_body(uint32_t b, uint32_t t, const uint32_t* keys, uint64_t n, uint32_t shift,
                                   uint32_t dbits, uint32_t* counts, uint32_t nblocks, uint32_t* hist) {
    const uint32_t bins = 1u << dbits;
    for (uint32_t d = t; d < bins; d += MSM_RADIX_THREADS) hist[d] = 0;
    __syncthreads();
    const uint64_t base = (uint64_t)b * MSM_RADIX_TILE;
    /* every load first, then the counts: the loads are all in flight at once (with a count after
     * each load, the atomics kept them one or four at a time: the pass waited on DRAM latency) */
    uint32_t key[MSM_RADIX_ITEMS];
#pragma unroll
    for (uint32_t k = 0; k < MSM_RADIX_ITEMS; k++) {
        uint64_t i = base + (uint64_t)k * MSM_RADIX_THREADS + t;
        key[k] = i < n ? keys[i] : 0;
    }
#pragma unroll
    for (uint32_t k = 0; k < MSM_RADIX_ITEMS; k++)
        if (base + (uint64_t)k * MSM_RADIX_THREADS + t < n) atomicAdd(hist + msm_radix_digit(key[k], shift, dbits), 1u);
    __syncthreads();
    for (uint32_t d = t; d < bins; d += MSM_RADIX_THREADS) counts[(uint64_t)d * nblocks + b] = hist[d];
}

/* Exclusive prefix sums over the block of one value per thread (the block's total not kept). */
FF_INLINE uint32_t msm_radix_block_scan(uint32_t t, uint32_t v, uint32_t* scan) {
    scan[t] = v;
    __syncthreads();
    /* Hillis-Steele over the block in shared memory: log2(T) steps, a barrier around each read */
    for (uint32_t o = 1; o < MSM_RADIX_THREADS; o <<= 1) {
        uint32_t add = t >= o ? scan[t - o] : 0;
        __syncthreads();
        scan[t] += add;
        __syncthreads();
    }
    return scan[t] - v;
}

/* One pass of block b: keys_in (and vals_in, or the positions themselves when null) to
 * keys_out / vals_out, or on the last pass (keys_out null) the positions to perm. */
FF_INLINE void msm_radix_scatter_body(uint32_t b, uint32_t t, const uint32_t* keys_in, const uint32_t* vals_in,
                                      uint64_t n, uint32_t shift, uint32_t dbits, const uint32_t* offsets,
                                      uint32_t nblocks, uint32_t* keys_out, uint32_t* vals_out, int64_t* perm,
                                      msm_radix_shared& sh) {
    const uint32_t bins = 1u << dbits;
    const uint32_t per = MSM_RADIX_BINS / MSM_RADIX_THREADS; /* digits per thread in the tile scan */
    const uint64_t base = (uint64_t)b * MSM_RADIX_TILE;
    const uint32_t lane = t & 31, warp = t >> 5, first = warp * MSM_RADIX_WARP_KEYS;
    for (uint32_t j = 0; j < per; j++)
        for (uint32_t w = 0; w < MSM_RADIX_WARPS; w++) sh.wc[w][t * per + j] = 0;
    __syncthreads();
    /* (0) this warp's keys and values, every load issued before the first is used (loaded inside
     * the ranking loop, each round's warp match waited for its own load: 16 DRAM latencies in a row) */
    uint32_t key[MSM_RADIX_ITEMS], val[MSM_RADIX_ITEMS], rank[MSM_RADIX_ITEMS];
#pragma unroll
    for (uint32_t k = 0; k < MSM_RADIX_ITEMS; k++) {
        uint64_t i = base + first + k * 32 + lane;
        key[k] = i < n ? keys_in[i] : 0;
    }
#pragma unroll
    for (uint32_t k = 0; k < MSM_RADIX_ITEMS; k++) {
        uint64_t i = base + first + k * 32 + lane;
        val[k] = i < n ? (vals_in ? vals_in[i] : (uint32_t)i) : 0;
    }
    /* (1) their digits and their ranks among the warp's keys of the same digit */
#pragma unroll
    for (uint32_t k = 0; k < MSM_RADIX_ITEMS; k++) {
        uint64_t i = base + first + k * 32 + lane;
        bool live = i < n;
        uint32_t d = live ? msm_radix_digit(key[k], shift, dbits) : MSM_RADIX_BINS;
#ifdef __CUDA_ARCH__
        unsigned peers = __match_any_sync(0xffffffffu, d);
        unsigned leader = __ffs(peers) - 1;
        uint32_t before = 0;
        if (live && lane == leader) {
            before = sh.wc[warp][d];
            sh.wc[warp][d] = (uint16_t)(before + __popc(peers));
        }
        rank[k] = __shfl_sync(0xffffffffu, before, leader) + __popc(peers & ((1u << lane) - 1));
        __syncwarp();
#else
        sh.digit[first + k * 32 + lane] = (uint16_t)d;
        rank[k] = 0;
        (void)lane;
#endif
    }
#ifndef __CUDA_ARCH__
    __syncthreads();
    for (uint32_t k = 0; k < MSM_RADIX_ITEMS; k++) {
        uint32_t at = first + k * 32 + lane, d = sh.digit[at];
        if (d >= bins) continue;
        uint32_t r = 0, all = 0;
        for (uint32_t u = first; u < first + MSM_RADIX_WARP_KEYS; u++) {
            if (sh.digit[u] != d) continue;
            r += u < at;
            all++;
        }
        rank[k] = r;
        if (!r) sh.wc[warp][d] = (uint16_t)all;
    }
#endif
    __syncthreads();
    /* (2) (digit, warp) counts -> slots: a warp's first slot of digit d = the tile's keys of smaller
     * digits + the earlier warps' keys of digit d; and each digit's global shift */
    uint32_t tot[MSM_RADIX_BINS / MSM_RADIX_THREADS], mine = 0;
    for (uint32_t j = 0; j < per; j++) {
        uint32_t d = t * per + j, run = 0;
        for (uint32_t w = 0; w < MSM_RADIX_WARPS; w++) {
            uint32_t c = sh.wc[w][d];
            sh.wc[w][d] = (uint16_t)run;
            run += c;
        }
        tot[j] = run;
        mine += run;
    }
    uint32_t off = msm_radix_block_scan(t, mine, sh.scan);
    for (uint32_t j = 0; j < per; j++) {
        uint32_t d = t * per + j;
        for (uint32_t w = 0; w < MSM_RADIX_WARPS; w++) sh.wc[w][d] = (uint16_t)(sh.wc[w][d] + off);
        if (d < bins) sh.delta[d] = offsets[(uint64_t)d * nblocks + b] - off;
        off += tot[j];
    }
    __syncthreads();
    /* (3) the tile sorted by digit in shared memory, then out in order */
#pragma unroll
    for (uint32_t k = 0; k < MSM_RADIX_ITEMS; k++) {
        if (base + first + k * 32 + lane >= n) continue;
        uint32_t p = sh.wc[warp][msm_radix_digit(key[k], shift, dbits)] + rank[k];
        sh.keys[p] = key[k];
        sh.vals[p] = val[k];
    }
    __syncthreads();
    const uint32_t tile_n = n - base < MSM_RADIX_TILE ? (uint32_t)(n - base) : MSM_RADIX_TILE;
    for (uint32_t j = t; j < tile_n; j += MSM_RADIX_THREADS) {
        uint32_t key = sh.keys[j];
        uint32_t g = j + sh.delta[msm_radix_digit(key, shift, dbits)];
        if (keys_out) {
            keys_out[g] = key;
            vals_out[g] = sh.vals[j];
        } else {
            perm[g] = (int64_t)sh.vals[j];
        }
    }
}
