/* The witness map on the device: a = A w, b = B w, c = a o b (Montgomery form) from a standard-form
 * witness, over the coded sparse rows of the circuit's shared data (cuzk_mp/algebra/coded_sparse.py,
 * whose evaluate_rows_into is the host version: the same per-entry paths, so the same field values;
 * every result is reduced below r, so the same bytes). Per entry of row r:
 *   - witness value 0: nothing; witness value 1: the coefficient's v R (table_mont) is added;
 *   - coefficient +-1 (codes 0, 1): w is added to / subtracted from a standard-form sum, turned into
 *     Montgomery form by one multiply by R^2 at the end of the row (or of the segment, below);
 *   - any other: v R^2 (table_r2) times w, one Montgomery multiply.
 * Rows past a matrix's last one are 0 (the domain's padding). The check of c against C w (with an
 * r1cs) stays on the host.
 *
 * Work split. A thread per row, as long as both of its rows (A's and B's) have at most `short_max`
 * entries: a warp runs as long as its longest row, and circuits have a few long rows among millions
 * of short ones (the PoRep-like circuit at 2^24: rows of 2-10 entries, 108 k of 33-162 and one of
 * 17 963, which alone took a whole 12 ms launch, one dependent load chain after another). The
 * other rows (the "long" ones, listed by the host) are cut into segments of at most `short_max`
 * entries of one side: a thread per segment writes its partial sum to scratch, then a thread per
 * long row adds up its segments and writes a, b, c.
 *
 *   witness_map_{u16,u32}       thread per row r < n; skips the long rows;
 *   witness_map_seg_{u16,u32}   thread per segment s: seg_k[s] = its first entry, seg_n[s] = its
 *                               entry count | WM_SEG_B (B's entries, else A's); partial[s] = its sum;
 *   witness_map_long            thread per long row i: long_rows[i] = the row, its A segments are
 *                               [seg_first[i], seg_mid[i]), its B segments [seg_mid[i], seg_first[i + 1]).
 */
#include "../ntt/fr_io.cuh"

#ifndef WM_THREADS
#define WM_THREADS 256
#endif

/* Entries a thread reads ahead: their columns and codes first, then their witness rows, then the
 * arithmetic, so each thread has this many independent 32-byte gathers in flight instead of one
 * chain of dependent loads per entry (H200, PoRep-like 2^24: 2.50 ms at 2, 3.47 at 4, 4.34 at 8,
 * whose registers cost occupancy; perf/results/gpu-witness-map-h200.json). */
#ifndef WM_BATCH
#define WM_BATCH 2
#endif

#define WM_CODE_ONE 0u
#define WM_CODE_MINUS_ONE 1u
#define WM_SEG_B 0x80000000u

/* A row's (or a segment's) sums: m in Montgomery form, s (the +-1 entries) in standard form. */
struct wm_sums {
    fr_t m, s;
    bool has_s;

    FF_INLINE static wm_sums zero() { return {fr_t::zero(), fr_t::zero(), false}; }
    FF_INLINE fr_t value() const { return has_s ? m + s.to_mont() : m; }
};

/* One entry (witness value wv, coefficient code) into its sums. */
FF_INLINE void wm_entry(wm_sums& acc, const fr_t& wv, uint32_t code, const uint64_t* tmont, const uint64_t* tr2) {
    uint32_t hi = wv.l[1];
#pragma unroll
    for (int i = 2; i < fr_t::N; i++) hi |= wv.l[i];
    if (hi == 0 && wv.l[0] <= 1) {
        if (wv.l[0]) acc.m += fr_ld_table(tmont, code);
    } else if (code == WM_CODE_ONE || code == WM_CODE_MINUS_ONE) {
        acc.s += code == WM_CODE_ONE ? wv : wv.neg();
        acc.has_s = true;
    } else {
        acc.m += fr_ld_table(tr2, code) * wv;
    }
}

/* Entries [k1, k1 + l1) of matrix 1 into s1, then [k2, k2 + l2) of matrix 2 into s2, as one list
 * read WM_BATCH entries at a time. */
template <class Code>
FF_INLINE void wm_entries(const uint32_t* cols1, const Code* codes1, uint32_t k1, uint32_t l1, wm_sums& s1,
                          const uint32_t* cols2, const Code* codes2, uint32_t k2, uint32_t l2, wm_sums& s2,
                          const uint64_t* tmont, const uint64_t* tr2, const uint64_t* w) {
    const uint32_t len = l1 + l2;
#pragma unroll 1
    for (uint32_t base = 0; base < len; base += WM_BATCH) {
        uint32_t col[WM_BATCH], code[WM_BATCH];
#pragma unroll
        for (int u = 0; u < WM_BATCH; u++) {
            uint32_t i = base + u;
            col[u] = 0;
            code[u] = 0;
            if (i < l1) {
                col[u] = cols1[k1 + i];
                code[u] = (uint32_t)codes1[k1 + i];
            } else if (i < len) {
                col[u] = cols2[k2 + (i - l1)];
                code[u] = (uint32_t)codes2[k2 + (i - l1)];
            }
        }
        fr_t wv[WM_BATCH];
#pragma unroll
        for (int u = 0; u < WM_BATCH; u++) wv[u] = base + u < len ? fr_ld_global(w, col[u]) : fr_t::zero();
#pragma unroll
        for (int u = 0; u < WM_BATCH; u++) {
            uint32_t i = base + u;
            if (i >= len) break;
            if (i < l1) wm_entry(s1, wv[u], code[u], tmont, tr2);
            else wm_entry(s2, wv[u], code[u], tmont, tr2);
        }
    }
}

FF_INLINE void wm_store(uint64_t r, const fr_t& va, const fr_t& vb, uint64_t* a, uint64_t* b, uint64_t* c) {
    fr_st_global(a, r, va);
    fr_st_global(b, r, vb);
    fr_st_global(c, r, va * vb);
}

template <class Code>
FF_INLINE void wm_row(uint64_t r, const uint32_t* a_ptr, uint64_t a_rows, const uint32_t* a_cols, const Code* a_codes,
                      const uint32_t* b_ptr, uint64_t b_rows, const uint32_t* b_cols, const Code* b_codes,
                      const uint64_t* tmont, const uint64_t* tr2, const uint64_t* w, uint64_t* a, uint64_t* b,
                      uint64_t* c, uint32_t short_max) {
    uint32_t ka = 0, la = 0, kb = 0, lb = 0;
    if (r < a_rows) {
        ka = a_ptr[r];
        la = a_ptr[r + 1] - ka;
    }
    if (r < b_rows) {
        kb = b_ptr[r];
        lb = b_ptr[r + 1] - kb;
    }
    if (la > short_max || lb > short_max) return; /* a long row: witness_map_seg / witness_map_long */
    wm_sums sa = wm_sums::zero(), sb = wm_sums::zero();
    wm_entries<Code>(a_cols, a_codes, ka, la, sa, b_cols, b_codes, kb, lb, sb, tmont, tr2, w);
    wm_store(r, sa.value(), sb.value(), a, b, c);
}

template <class Code>
FF_INLINE void wm_segment(uint64_t s, const uint32_t* seg_k, const uint32_t* seg_n, const uint32_t* a_cols,
                          const Code* a_codes, const uint32_t* b_cols, const Code* b_codes, const uint64_t* tmont,
                          const uint64_t* tr2, const uint64_t* w, uint64_t* partial) {
    const uint32_t n = seg_n[s], len = n & ~WM_SEG_B;
    const bool on_b = (n & WM_SEG_B) != 0;
    wm_sums acc = wm_sums::zero(), none = wm_sums::zero();
    wm_entries<Code>(on_b ? b_cols : a_cols, on_b ? b_codes : a_codes, seg_k[s], len, acc, a_cols, a_codes, 0, 0, none,
                     tmont, tr2, w);
    fr_st_global(partial, s, acc.value());
}

/* Sum of partial[lo, hi), four loads ahead of the additions. */
FF_INLINE fr_t wm_sum_partials(const uint64_t* partial, uint32_t lo, uint32_t hi) {
    fr_t acc = fr_t::zero();
    uint32_t j = lo;
#pragma unroll 1
    for (; j + 4 <= hi; j += 4) {
        fr_t p0 = fr_ld_global(partial, j), p1 = fr_ld_global(partial, j + 1), p2 = fr_ld_global(partial, j + 2),
             p3 = fr_ld_global(partial, j + 3);
        acc += (p0 + p1) + (p2 + p3);
    }
#pragma unroll 1
    for (; j < hi; j++) acc += fr_ld_global(partial, j);
    return acc;
}

/* grid: ceil(n / WM_THREADS) blocks; n = the domain size (rows of a, b, c); codes uint16 or uint32
 * (one entry point each, written out: the package finds its kernels by their extern "C" lines). */
extern "C" __global__ void __launch_bounds__(WM_THREADS)
witness_map_u16(const uint32_t* a_ptr, uint64_t a_rows, const uint32_t* a_cols, const uint16_t* a_codes,
                const uint32_t* b_ptr, uint64_t b_rows, const uint32_t* b_cols, const uint16_t* b_codes,
                const uint64_t* tmont, const uint64_t* tr2, const uint64_t* w, uint64_t* a, uint64_t* b, uint64_t* c,
                uint64_t n, uint32_t short_max) {
    uint64_t r = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r < n)
        wm_row<uint16_t>(r, a_ptr, a_rows, a_cols, a_codes, b_ptr, b_rows, b_cols, b_codes, tmont, tr2, w, a, b, c,
                         short_max);
}

extern "C" __global__ void __launch_bounds__(WM_THREADS)
witness_map_u32(const uint32_t* a_ptr, uint64_t a_rows, const uint32_t* a_cols, const uint32_t* a_codes,
                const uint32_t* b_ptr, uint64_t b_rows, const uint32_t* b_cols, const uint32_t* b_codes,
                const uint64_t* tmont, const uint64_t* tr2, const uint64_t* w, uint64_t* a, uint64_t* b, uint64_t* c,
                uint64_t n, uint32_t short_max) {
    uint64_t r = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r < n)
        wm_row<uint32_t>(r, a_ptr, a_rows, a_cols, a_codes, b_ptr, b_rows, b_cols, b_codes, tmont, tr2, w, a, b, c,
                         short_max);
}

/* grid: ceil(segments / WM_THREADS) blocks */
extern "C" __global__ void __launch_bounds__(WM_THREADS)
witness_map_seg_u16(const uint32_t* seg_k, const uint32_t* seg_n, uint64_t segments, const uint32_t* a_cols,
                    const uint16_t* a_codes, const uint32_t* b_cols, const uint16_t* b_codes, const uint64_t* tmont,
                    const uint64_t* tr2, const uint64_t* w, uint64_t* partial) {
    uint64_t s = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (s < segments) wm_segment<uint16_t>(s, seg_k, seg_n, a_cols, a_codes, b_cols, b_codes, tmont, tr2, w, partial);
}

extern "C" __global__ void __launch_bounds__(WM_THREADS)
witness_map_seg_u32(const uint32_t* seg_k, const uint32_t* seg_n, uint64_t segments, const uint32_t* a_cols,
                    const uint32_t* a_codes, const uint32_t* b_cols, const uint32_t* b_codes, const uint64_t* tmont,
                    const uint64_t* tr2, const uint64_t* w, uint64_t* partial) {
    uint64_t s = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (s < segments) wm_segment<uint32_t>(s, seg_k, seg_n, a_cols, a_codes, b_cols, b_codes, tmont, tr2, w, partial);
}

/* grid: ceil(long rows / WM_THREADS) blocks */
extern "C" __global__ void __launch_bounds__(WM_THREADS)
witness_map_long(const uint64_t* long_rows, uint64_t n_long, const uint32_t* seg_first, const uint32_t* seg_mid,
                 const uint64_t* partial, uint64_t* a, uint64_t* b, uint64_t* c) {
    uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n_long) return;
    fr_t va = wm_sum_partials(partial, seg_first[i], seg_mid[i]);
    fr_t vb = wm_sum_partials(partial, seg_mid[i], seg_first[i + 1]);
    wm_store(long_rows[i], va, vb, a, b, c);
}
