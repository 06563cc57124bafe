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

/* One CIOS step of the four-product sum (mont_t::mad_n_redc with four rows). */
FF_INLINE void fq_sum4_step(uint32_t* lo, uint32_t* hi, bool first, const uint32_t* a, uint32_t bi,
                            const uint32_t* c, uint32_t di, const uint32_t* e, uint32_t fi, const uint32_t* g,
                            uint32_t hi2) {
    constexpr int N = fp_t::N;
    uint32_t P[N];
    fp_t::load_mod(P);
    ptx::cc_t cc;
    if (first) {
        fp_t::mul_n(hi, a + 1, bi);
        fp_t::mul_n(lo, a, bi);
    } else {
        lo[0] = ptx::add_cc(lo[0], hi[1], cc);
        fp_t::madc_n_rshift(hi, a + 1, bi, cc);
        fp_t::cmad_n(lo, a, bi, cc);
        hi[N - 1] = ptx::addc(hi[N - 1], 0, cc);
    }
    fp_t::cmad_n(hi, c + 1, di, cc);
    fp_t::cmad_n(lo, c, di, cc);
    hi[N - 1] = ptx::addc(hi[N - 1], 0, cc);
    fp_t::cmad_n(hi, e + 1, fi, cc);
    fp_t::cmad_n(lo, e, fi, cc);
    hi[N - 1] = ptx::addc(hi[N - 1], 0, cc);
    fp_t::cmad_n(hi, g + 1, hi2, cc);
    fp_t::cmad_n(lo, g, hi2, cc);
    hi[N - 1] = ptx::addc(hi[N - 1], 0, cc);
    uint32_t m = lo[0] * fq_field::M0;
    fp_t::cmad_n(hi, P + 1, m, cc);
    fp_t::cmad_n(lo, P, m, cc);
    hi[N - 1] = ptx::addc(hi[N - 1], 0, cc);
}

FF_INLINE fp_t fq_mul_add4(const fp_t& a, const fp_t& b, const fp_t& c, const fp_t& d, const fp_t& e,
                           const fp_t& f, const fp_t& g, const fp_t& h) {
    constexpr int N = fp_t::N;
    static_assert(N == 12, "fq_mul_add4 needs 5p < R");
    uint32_t even[N], odd[N];
#pragma unroll
    for (int i = 0; i < N; i += 2) {
        fq_sum4_step(even, odd, i == 0, a.l, b.l[i], c.l, d.l[i], e.l, f.l[i], g.l, h.l[i]);
        fq_sum4_step(odd, even, false, a.l, b.l[i + 1], c.l, d.l[i + 1], e.l, f.l[i + 1], g.l, h.l[i + 1]);
    }
    return fp_t::fold(even, odd);
}
