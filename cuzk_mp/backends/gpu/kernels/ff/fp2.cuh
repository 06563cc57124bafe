/* fp2_t: Fq2 = Fq[u] / (u^2 + 1), the coordinate field of G2.
 *
 * c0 + c1 u, both Montgomery fp_t; load/store move 12 uint64 limbs (c0 then c1),
 * the zkey layout of a G2 coordinate. Costs: mul 3M + 5A (Karatsuba),
 * sqr 2M + 3A ((c0 + c1)(c0 - c1) + 2 c0 c1 u), inv 2S + 3M + 1 Fq inversion.
 */
#pragma once
#include "fp.cuh"

struct fp2_t {
    fp_t c0, c1;

    FF_INLINE static fp2_t zero() { return {fp_t::zero(), fp_t::zero()}; }
    FF_INLINE static fp2_t one() { return {fp_t::one(), fp_t::zero()}; }
    FF_INLINE static fp2_t load(const uint64_t* p) { return {fp_t::load(p), fp_t::load(p + 6)}; }
    FF_INLINE void store(uint64_t* p) const {
        c0.store(p);
        c1.store(p + 6);
    }

    FF_INLINE bool is_zero() const { return c0.is_zero() && c1.is_zero(); }
    FF_INLINE bool operator==(const fp2_t& b) const { return c0 == b.c0 && c1 == b.c1; }
    FF_INLINE bool operator!=(const fp2_t& b) const { return !(*this == b); }

    FF_INLINE fp2_t operator+(const fp2_t& b) const { return {c0 + b.c0, c1 + b.c1}; }
    FF_INLINE fp2_t operator-(const fp2_t& b) const { return {c0 - b.c0, c1 - b.c1}; }
    FF_INLINE fp2_t dbl() const { return {c0.dbl(), c1.dbl()}; }
    FF_INLINE fp2_t neg() const { return {c0.neg(), c1.neg()}; }

    /* Karatsuba: (a0 b0 - a1 b1) + ((a0 + a1)(b0 + b1) - a0 b0 - a1 b1) u */
    FF_INLINE fp2_t operator*(const fp2_t& b) const {
        fp_t t0 = c0 * b.c0;
        fp_t t1 = c1 * b.c1;
        fp_t t2 = (c0 + c1) * (b.c0 + b.c1);
        return {t0 - t1, t2 - t0 - t1};
    }
    /* (c0 + c1)(c0 - c1) + 2 c0 c1 u */
    FF_INLINE fp2_t sqr() const {
        fp_t t = c0 * c1;
        return {(c0 + c1) * (c0 - c1), t.dbl()};
    }
    FF_INLINE fp2_t mul_by_fp(const fp_t& s) const { return {c0 * s, c1 * s}; }
    /* times (1 + u), the G2 twist's non-residue: (c0 - c1) + (c0 + c1) u */
    FF_INLINE fp2_t mul_by_nonresidue() const { return {c0 - c1, c0 + c1}; }

    FF_INLINE fp2_t& operator+=(const fp2_t& b) { return *this = *this + b; }
    FF_INLINE fp2_t& operator-=(const fp2_t& b) { return *this = *this - b; }
    FF_INLINE fp2_t& operator*=(const fp2_t& b) { return *this = *this * b; }

    /* (c0 - c1 u) / (c0^2 + c1^2); 0 maps to 0. */
    FF_INLINE fp2_t inv() const {
        fp_t t = (c0.sqr() + c1.sqr()).inv();
        return {c0 * t, (c1 * t).neg()};
    }
};
