/* The witness map on the device: a = A w, b = B w, c = a o b (Montgomery form) from a standard-form
 * witness, over the coded sparse rows of the circuit's shared data (cuzk_mp/algebra/coded_sparse.py,
 * whose evaluate_rows_into is the host version: the same per-entry paths, so the same field values;
 * every result is reduced below r, so the same bytes). Per entry of row r:
 *   - witness value 0: nothing; witness value 1: the coefficient's v R (table_mont) is added;
 *   - coefficient +-1 (codes 0, 1): w is added to / subtracted from a standard-form sum, turned into
 *     Montgomery form by one multiply by R^2 at the end of the row;
 *   - any other: v R^2 (table_r2) times w, one Montgomery multiply.
 * One thread per row, rows past a matrix's last one are 0 (the domain's padding). The check of
 * c against C w (with an r1cs) stays on the host.
 */
#include "../ff/fr.cuh"

#ifndef WM_THREADS
#define WM_THREADS 256
#endif

#define WM_CODE_ONE 0u
#define WM_CODE_MINUS_ONE 1u

template <class Code>
FF_INLINE fr_t wm_row(uint64_t r, const uint32_t* ptr, uint64_t rows, const uint32_t* cols, const Code* codes,
                      const uint64_t* tmont, const uint64_t* tr2, const uint64_t* w) {
    fr_t m = fr_t::zero();
    if (r >= rows) return m;
    fr_t s = fr_t::zero();
    bool has_s = false;
    for (uint32_t k = ptr[r], k1 = ptr[r + 1]; k < k1; k++) {
        const uint64_t* wj = w + 4 * (uint64_t)cols[k];
        uint32_t code = (uint32_t)codes[k];
        uint64_t w0 = wj[0], hi = wj[1] | wj[2] | wj[3];
        if (hi == 0 && w0 <= 1) {
            if (w0) m += fr_t::load(tmont + 4 * (uint64_t)code);
        } else if (code == WM_CODE_ONE) {
            s += fr_t::load(wj);
            has_s = true;
        } else if (code == WM_CODE_MINUS_ONE) {
            s -= fr_t::load(wj);
            has_s = true;
        } else {
            m += fr_t::load(tr2 + 4 * (uint64_t)code) * fr_t::load(wj);
        }
    }
    if (has_s) m += s.to_mont();
    return m;
}

template <class Code>
FF_INLINE void wm_one(uint64_t r, const uint32_t* a_ptr, uint64_t a_rows, const uint32_t* a_cols, const Code* a_codes,
                      const uint32_t* b_ptr, uint64_t b_rows, const uint32_t* b_cols, const Code* b_codes,
                      const uint64_t* tmont, const uint64_t* tr2, const uint64_t* w, uint64_t* a, uint64_t* b,
                      uint64_t* c) {
    fr_t va = wm_row<Code>(r, a_ptr, a_rows, a_cols, a_codes, tmont, tr2, w);
    fr_t vb = wm_row<Code>(r, b_ptr, b_rows, b_cols, b_codes, tmont, tr2, w);
    va.store(a + 4 * r);
    vb.store(b + 4 * r);
    (va * vb).store(c + 4 * r);
}

/* grid: ceil(n / WM_THREADS) blocks; n = the domain size (rows of a, b, c); codes uint16 or uint32
 * (one entry point each, written out: the package finds its kernels by their extern "C" lines). */
extern "C" __global__ void __launch_bounds__(WM_THREADS)
witness_map_u16(const uint32_t* a_ptr, uint64_t a_rows, const uint32_t* a_cols, const uint16_t* a_codes,
                const uint32_t* b_ptr, uint64_t b_rows, const uint32_t* b_cols, const uint16_t* b_codes,
                const uint64_t* tmont, const uint64_t* tr2, const uint64_t* w, uint64_t* a, uint64_t* b, uint64_t* c,
                uint64_t n) {
    uint64_t r = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r < n) wm_one<uint16_t>(r, a_ptr, a_rows, a_cols, a_codes, b_ptr, b_rows, b_cols, b_codes, tmont, tr2, w, a, b, c);
}

extern "C" __global__ void __launch_bounds__(WM_THREADS)
witness_map_u32(const uint32_t* a_ptr, uint64_t a_rows, const uint32_t* a_cols, const uint32_t* a_codes,
                const uint32_t* b_ptr, uint64_t b_rows, const uint32_t* b_cols, const uint32_t* b_codes,
                const uint64_t* tmont, const uint64_t* tr2, const uint64_t* w, uint64_t* a, uint64_t* b, uint64_t* c,
                uint64_t n) {
    uint64_t r = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (r < n) wm_one<uint32_t>(r, a_ptr, a_rows, a_cols, a_codes, b_ptr, b_rows, b_cols, b_codes, tmont, tr2, w, a, b, c);
}
