/* MSM kernels for one group: G1 (default) or G2 (-DMSM_G2=1), one module each.
 *
 * Thin extern "C" wrappers over the bodies in digits.cuh, accumulate.cuh and
 * reduce.cuh; the host side (cuzk_mp/backends/gpu/msm.py) computes every launch
 * geometry. All kernels are 1-D: grid = ceil(threads / MSM_NTHREADS) blocks of
 * MSM_NTHREADS, thread t = blockIdx.x * blockDim.x + threadIdx.x, no shared
 * memory, no inter-thread cooperation (so each body also runs on a CPU, where the
 * test emulator loops over t; the grid batch-affine kernels msm_ga_* are of this kind too).
 * Layouts: scalars (m, 4) uint64 standard form;
 * points zkey layout (affine_t); buckets / partial sums xyzz_t; index arrays int64.
 */
#include "../ec/xyzz.cuh"
#include "digits.cuh"
#include "accumulate.cuh"
#include "sort.cuh"
#include "batch_affine.cuh"
#include "grid_affine.cuh"
#include "reduce.cuh"

#ifndef MSM_G2
#define MSM_G2 0
#endif
#if MSM_G2
typedef fp2_t msm_field_t;
#else
typedef fp_t msm_field_t;
#endif

#ifndef MSM_NTHREADS
#define MSM_NTHREADS 128
#endif
#if MSM_NTHREADS % 32 != 0 || MSM_NTHREADS > 1024
#error "MSM_NTHREADS must be a multiple of 32, at most 1024"
#endif

/* Minimum resident blocks per SM asked of ptxas for msm_accumulate (__launch_bounds__'s
 * second argument): it caps the registers at 64 K / (MSM_NTHREADS x this), so a value
 * above what 255 registers allow trades spills (local memory, L1-resident) for warps. */
#ifndef MSM_ACC_MIN_BLOCKS
#define MSM_ACC_MIN_BLOCKS 1
#endif

#define MSM_TID ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x)

/* threads = m: cls[i] in {0 zero, 1 one, 2 other}; *flag = 1 if some scalar has bit 255 set. */
extern "C" __global__ void __launch_bounds__(MSM_NTHREADS)
msm_classify(const uint64_t* scalars, uint8_t* cls, uint32_t* flag, uint64_t m) {
    uint64_t t = MSM_TID;
    if (t < m) msm_classify_one(t, scalars, cls, flag);
}

/* threads = m (scalars of the tail, or of a batch of MSMs, `per` each): keys[wl m + i] for
 * windows w0 .. w0 + nw - 1; cfg = c | wb << 8 picks the key layout (digits.cuh). */
extern "C" __global__ void __launch_bounds__(MSM_NTHREADS)
msm_digits(const uint64_t* scalars, const int64_t* idx, uint32_t* keys, uint64_t m, uint32_t w0,
           uint32_t nw, uint32_t cfg, uint64_t per) {
    uint64_t t = MSM_TID;
    if (t < m) msm_digits_one(t, scalars, idx, keys, m, w0, nw, cfg, per);
}

/* The counting sort of a window batch's n keys (sort.cuh): `keys` has n + 1 elements (the last
 * one is set to MSM_KEY_NONE), `counts` the batch's bins bucket counters, zeroed by the host.
 * threads = n for count and scatter; scan: ONE block of MSM_SCAN_THREADS over the counters. */
#ifndef MSM_SCAN_THREADS
#define MSM_SCAN_THREADS 512
#endif

extern "C" __global__ void __launch_bounds__(MSM_NTHREADS)
msm_sort_count(uint32_t* keys, uint32_t* counts, int64_t* perm, uint64_t n, uint32_t cfg) {
    uint64_t t = MSM_TID;
    if (t < n) msm_sort_count_one(t, keys, counts, perm, n, cfg);
}

extern "C" __global__ void __launch_bounds__(MSM_SCAN_THREADS)
msm_sort_scan(uint32_t* counts, uint64_t n) {
    __shared__ uint32_t part[MSM_SCAN_THREADS];
    msm_sort_scan_body(threadIdx.x, blockDim.x, counts, n, part);
}

extern "C" __global__ void __launch_bounds__(MSM_NTHREADS)
msm_sort_scatter(const uint32_t* keys, uint32_t* offsets, int64_t* perm, uint64_t n, uint32_t cfg) {
    uint64_t t = MSM_TID;
    if (t < n) msm_sort_scatter_one(t, keys, offsets, perm, cfg);
}

/* Resident blocks per SM asked of ptxas for msm_radix_scatter: its 16 keys, values and ranks a
 * thread, all loaded before the ranking, take 125 registers at 2 blocks of 256 a SM (no spills);
 * 3 blocks cap them at 80 (100 B of spills), 4 at 64 (184 B). Measured on the H200 (perf/results/
 * gpu-msm-radix-sort-h200.json): the 2^27 H-shaped sort 59.2 ms at 2, 66.6 at 3; 2^24 7.6 / 8.6 /
 * 9.5 ms at 2 / 3 / 4. */
#ifndef MSM_RADIX_MIN_BLOCKS
#define MSM_RADIX_MIN_BLOCKS 2
#endif

/* The radix sort of a window batch (sort.cuh): grid = nblocks = ceil(n / MSM_RADIX_TILE) blocks of
 * MSM_RADIX_THREADS; one hist and one scatter launch a pass, the host scanning counts between. */
extern "C" __global__ void __launch_bounds__(MSM_RADIX_THREADS)
msm_radix_hist(const uint32_t* keys, uint64_t n, uint32_t shift, uint32_t dbits, uint32_t* counts,
               uint32_t nblocks) {
    __shared__ uint32_t hist[MSM_RADIX_BINS];
    msm_radix_hist_body(blockIdx.x, threadIdx.x, keys, n, shift, dbits, counts, nblocks, hist);
}

extern "C" __global__ void __launch_bounds__(MSM_RADIX_THREADS, MSM_RADIX_MIN_BLOCKS)
msm_radix_scatter(const uint32_t* keys_in, const uint32_t* vals_in, uint64_t n, uint32_t shift, uint32_t dbits,
                  const uint32_t* offsets, uint32_t nblocks, uint32_t* keys_out, uint32_t* vals_out,
                  int64_t* perm) {
    __shared__ msm_radix_shared sh;
    msm_radix_scatter_body(blockIdx.x, threadIdx.x, keys_in, vals_in, n, shift, dbits, offsets, nblocks, keys_out,
                           vals_out, perm, sh);
}

/* threads = ceil(n / seg): level-1 accumulation of the n sorted entries (accumulate.cuh); m scalars,
 * `per` per MSM of a batch. */
extern "C" __global__ void __launch_bounds__(MSM_NTHREADS, MSM_ACC_MIN_BLOCKS)
msm_accumulate(const int64_t* perm, const uint32_t* keys, const int64_t* tail_idx, const uint64_t* points,
               uint64_t* buckets, uint64_t* heads, uint32_t* head_keys, uint64_t n, uint64_t m, uint32_t cfg,
               uint64_t stride, uint32_t seg, uint64_t per) {
    uint64_t t = MSM_TID;
    if (t * seg < n)
        msm_accumulate_body<msm_field_t>(t, perm, keys, tail_idx, points, buckets, heads, head_keys, n, m, cfg,
                                         stride, seg, per);
}

/* Grid batch-affine rounds (grid_affine.cuh). A list is (points, rows) or pts, with bucket ids
 * bk (bk[-1] readable) and length *len (len null: len0).
 *   msm_ga_rows   threads = n: round 0's list from the sorted entries [j0, j0 + n);
 *   msm_ga_count  threads = slots (an upper bound of ceil(len / 2)): counts[s];
 *   msm_ga_den    threads = G: prefix products pref and per-thread products prods;
 *   msm_ga_add    threads = G: the round's output list (out, out_bk), pos = inclusive sums of counts;
 *   msm_ga_inv    op 0 up / 1 down: threads = g over n values; op 2: the top, ONE thread (prods:
 *                 one element of scratch);
 *   msm_accumulate_list  threads = ceil(upper bound of len / seg): level 1 over a list. */
extern "C" __global__ void __launch_bounds__(MSM_NTHREADS)
msm_ga_rows(const int64_t* perm, const uint32_t* keys, const int64_t* tail_idx, uint64_t j0, uint64_t n,
            uint64_t m, uint32_t cfg, uint64_t stride, uint64_t per, uint64_t* rows, uint32_t* bk) {
    uint64_t t = MSM_TID;
    const msm_entry_src<msm_field_t> e = {perm, keys, tail_idx, nullptr, m, stride, per, cfg};
    if (t < n) msm_ga_rows_one<msm_field_t>(t, e, j0, rows, bk);
}

extern "C" __global__ void __launch_bounds__(MSM_NTHREADS)
msm_ga_count(const uint32_t* bk, const int64_t* len, uint64_t len0, uint32_t* counts, uint64_t slots) {
    uint64_t t = MSM_TID;
    if (t >= slots) return;
    const ga_list<msm_field_t> L = ga_make_list<msm_field_t>(nullptr, nullptr, nullptr, bk, len, len0);
    bool pair;
    counts[t] = L.count(t, pair);
}

extern "C" __global__ void __launch_bounds__(MSM_NTHREADS)
msm_ga_den(const uint64_t* points, const uint64_t* rows, const uint64_t* pts, const uint32_t* bk,
           const int64_t* len, uint64_t len0, uint64_t* pref, uint64_t* prods, uint64_t G) {
    uint64_t t = MSM_TID;
    if (t < G)
        msm_ga_den_body<msm_field_t>(t, G, ga_make_list<msm_field_t>(points, rows, pts, bk, len, len0), pref, prods);
}

/* Minimum resident blocks per SM asked of ptxas for msm_ga_add (its register cap, as
 * MSM_ACC_MIN_BLOCKS for msm_accumulate). */
#ifndef GA_ADD_MIN_BLOCKS
#define GA_ADD_MIN_BLOCKS 1
#endif

extern "C" __global__ void __launch_bounds__(MSM_NTHREADS, GA_ADD_MIN_BLOCKS)
msm_ga_add(const uint64_t* points, const uint64_t* rows, const uint64_t* pts, const uint32_t* bk,
           const int64_t* len, uint64_t len0, const int64_t* pos, const uint64_t* pref, const uint64_t* inv_prods,
           uint64_t* out, uint32_t* out_bk, uint64_t G) {
    uint64_t t = MSM_TID;
    if (t < G)
        msm_ga_add_body<msm_field_t>(t, G, ga_make_list<msm_field_t>(points, rows, pts, bk, len, len0), pos, pref,
                                     inv_prods, out, out_bk);
}

extern "C" __global__ void __launch_bounds__(MSM_NTHREADS)
msm_ga_inv(uint32_t op, uint64_t* vals, uint64_t* pre, uint64_t* prods, uint64_t n, uint64_t g) {
    uint64_t t = MSM_TID;
    if (op == 0 && t < g) msm_ga_inv_up<msm_field_t>(t, g, n, vals, pre, prods);
    if (op == 1 && t < g) msm_ga_inv_down<msm_field_t>(t, g, n, vals, pre, prods);
    if (op == 2 && t == 0) msm_ga_inv_top<msm_field_t>(n, vals, pre, prods);
}

extern "C" __global__ void __launch_bounds__(MSM_NTHREADS, MSM_ACC_MIN_BLOCKS)
msm_accumulate_list(const uint64_t* points, const uint64_t* rows, const uint64_t* pts, const uint32_t* bk,
                    const int64_t* len, uint64_t len0, uint64_t* buckets, uint64_t* heads, uint32_t* head_keys,
                    uint32_t seg, uint64_t threads) {
    uint64_t t = MSM_TID;
    if (t >= threads) return;
    const ga_list<msm_field_t> L = ga_make_list<msm_field_t>(points, rows, pts, bk, len, len0);
    if (t * seg < L.len)
        msm_level1_body<msm_field_t>(t, L.src, buckets, heads, head_keys, L.len, seg);
    else
        head_keys[t] = MSM_BUCKET_NONE;
}

/* The four reduction steps share ONE entry point, chosen by `op`: ptxas compiles the
 * __noinline__ XYZZ add/dbl once per entry that calls them (seen with -Xptxas -v:
 * four G2 entries took ~4x one), so one entry keeps the module's compile time down.
 * They are short launches next to the accumulation, so the switch costs nothing.
 *   MSM_OP_COMBINE  threads = ceil(n / p1): combine level over n heads
 *                   (a, a_keys) -> buckets b, new heads (out, out_keys); p1 = seg
 *   MSM_OP_BUCKETS  threads = n: chunk shares of window sums, buckets a -> out;
 *                   p1 = nb (buckets per window), p2 = chunk; b null: each share complete
 *                   (a scalar multiplication a thread), else the chunk sums -> b as the
 *                   buckets of a second reduction (reduce.cuh)
 *   MSM_OP_GROUPS   threads = ceil(n / p1): out[t] = sum of a[t p1 .. ) (n inputs)
 *   MSM_OP_ADD      threads = n: out[t] += 2^p1 a[t] (two bucket sets made one: p1 = 0;
 *                   a second reduction added to its first: p1 = log2(chunk))
 * The last step, Horner over the window sums (c (W - 1) doublings in a chain), runs
 * on the host (msm.py): one GPU thread took 9.5 ms for it on G2, arkworks ~1 ms. */
#define MSM_OP_COMBINE 0
#define MSM_OP_BUCKETS 1
#define MSM_OP_GROUPS 2
#define MSM_OP_ADD 3

extern "C" __global__ void __launch_bounds__(MSM_NTHREADS)
msm_reduce(uint32_t op, const uint64_t* a, const uint32_t* a_keys, uint64_t* b, uint64_t* out,
           uint32_t* out_keys, uint64_t n, uint32_t p1, uint32_t p2) {
    uint64_t t = MSM_TID;
    switch (op) {
    case MSM_OP_COMBINE:
        if (t * p1 < n) msm_combine_body<msm_field_t>(t, a, a_keys, b, out, out_keys, n, p1);
        break;
    case MSM_OP_BUCKETS:
        if (t < n) msm_bucket_reduce_body<msm_field_t>(t, a, out, b, p1, p2);
        break;
    case MSM_OP_GROUPS:
        if (t * p1 < n) msm_sum_groups_body<msm_field_t>(t, a, out, n, p1);
        break;
    case MSM_OP_ADD:
        if (t < n) msm_add_sets_body<msm_field_t>(t, a, out, p1);
        break;
    }
}
