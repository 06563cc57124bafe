/* fq_mul_add4: (a b + c d + e f + g h) R^-1 in Fq with ONE Montgomery reduction.
 *
 * mont_t::mul_add (mont.cuh) with four products instead of two: each CIOS step adds a * b_i,
 * c * d_i, e * f_i and g * h_i before its m * p, so 5 N^2 + N 32-bit products (Fq: 732) instead
 * of 6 N^2 + 2N for two fused products (888) or 8 N^2 + 4N for four plain ones. Bounds, for
 * canonical a, c, e, g and b, d, f, h below p: the running value stays below 5p + 1, which fits
 * N words where 5p < R (Fq: p < 2^381, R = 2^384), so (as in mad_n_redc) a chain's carry out of
 * the high accumulator is 0 and one out of the low one lands on its top word; the result is below
 * p + 4 p^2 / R < 2p, so one final subtraction (mont_t::fold) makes it canonical.
 * Why: a component of the Fq2 difference r s - y p (the mixed addition's Y3) in the G2
 * accumulation by lane pairs (msm/split.cuh) is such a sum. A header of its own, beside mont.cuh,
 * so that the modules that do not use it are compiled from unchanged sources.
 */
#pragma once
#include "fp.cuh"

/* One CIOS step of the four-product sum (mont_t::mad_n_redc with four rows): the rows x[k] times
 * y[k] (k < 4) and then p times m added to the running value (lo, hi). */
FF_INLINE void fq_sum4_step(uint32_t* lo, uint32_t* hi, bool first, const uint32_t* const x[4], const uint32_t y[4]) {
    constexpr int N = fp_t::N;
    uint32_t P[N];
    fp_t::load_mod(P);
    ptx::cc_t cc;
    if (first) {
        fp_t::mul_n(hi, x[0] + 1, y[0]);
        fp_t::mul_n(lo, x[0], y[0]);
    } else {
        lo[0] = ptx::add_cc(lo[0], hi[1], cc);
        fp_t::madc_n_rshift(hi, x[0] + 1, y[0], cc);
        fp_t::cmad_n(lo, x[0], y[0], cc);
        hi[N - 1] = ptx::addc(hi[N - 1], 0, cc);
    }
    uint32_t m = 0;
#pragma unroll
    for (int k = 1; k <= 4; k++) {
        const uint32_t* row = k < 4 ? x[k] : P;
        if (k == 4) m = lo[0] * fq_field::M0;
        const uint32_t yk = k < 4 ? y[k] : m;
        fp_t::cmad_n(hi, row + 1, yk, cc);
        fp_t::cmad_n(lo, row, yk, cc);
        hi[N - 1] = ptx::addc(hi[N - 1], 0, cc);
    }
}

FF_INLINE fp_t fq_mul_add4(const fp_t& a, const fp_t& b, const fp_t& c, const fp_t& d, const fp_t& e,
                           const fp_t& f, const fp_t& g, const fp_t& h) {
    constexpr int N = fp_t::N;
    static_assert(N == 12, "fq_mul_add4 needs 5p < R");
    uint32_t even[N], odd[N];
#pragma unroll
    for (int i = 0; i < N; i += 2) {
        const uint32_t* const x[4] = {a.l, c.l, e.l, g.l};
        const uint32_t y0[4] = {b.l[i], d.l[i], f.l[i], h.l[i]}, y1[4] = {b.l[i + 1], d.l[i + 1], f.l[i + 1], h.l[i + 1]};
        fq_sum4_step(even, odd, i == 0, x, y0);
        fq_sum4_step(odd, even, false, x, y1);
    }
    return fp_t::fold(even, odd);
}
