/* affine_t<F>: a short-Weierstrass point (x, y) in the zkey storage layout.
 *
 * F is fp_t (G1) or fp2_t (G2). Memory layout = the zkey's: x then y, each F's
 * own load/store layout (6 uint64 Montgomery limbs for fp_t, 12 for fp2_t), so
 * a G1 point is 12 uint64 and a G2 point 24. The point at infinity is stored as
 * all zeros: (0, 0) is on neither curve (0 != 0 + b), so the encoding is
 * unambiguous. Unused wires of a zkey are such zero points.
 */
#pragma once
#include "../ff/fp2.cuh"

/* uint64 words of one coordinate: 6 for fp_t, 12 for fp2_t (both 32-bit-word storage). */
template <class F>
struct field_words {
    static constexpr int value = (int)(sizeof(F) / 8);
    static_assert(sizeof(F) == 48 || sizeof(F) == 96, "field_words: F must be fp_t or fp2_t");
};

template <class F>
struct affine_t {
    F x, y;
    static constexpr int CW = field_words<F>::value; /* words per coordinate */
    static constexpr int WORDS = 2 * CW;             /* words per stored point */

    FF_INLINE static affine_t load(const uint64_t* p) { return {F::load(p), F::load(p + CW)}; }
    FF_INLINE void store(uint64_t* p) const {
        x.store(p);
        y.store(p + CW);
    }
    FF_INLINE static affine_t inf() { return {F::zero(), F::zero()}; }
    /* (0, 0) is the stored form of infinity (see the file comment). */
    FF_INLINE bool is_inf() const { return x.is_zero() && y.is_zero(); }
    /* -(x, y) = (x, -y); fp neg() maps 0 to 0, so -inf stays the all-zero encoding. */
    FF_INLINE affine_t neg() const { return {x, y.neg()}; }
};
