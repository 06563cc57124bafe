/* fq_mul_dfma / fq_sqr_dfma: the Fq Montgomery product with the partial products on the FP64 pipe.
 *
 * Why: mont_t's multiply (mont.cuh) is bound by the integer multiply pipe (IMAD, with
 * IMAD.WIDE at half rate) while the FP64 pipe of sm_90 (as many DFMA per clock as IMAD)
 * sits idle. Here the 48 x 48-bit partial products are exact double-precision FMAs
 * (the "double-precision multiprecision" technique of Emmart, Zheng and Weems), the
 * column sums are 64-bit integer adds (ALU pipe) and the Montgomery quotient digits are
 * IMADs, so the work spreads over three pipes. Same contract as fp_t's a * b and
 * a.sqr(): canonical 12 x 32-bit-word Montgomery form in and out, R = 2^384.
 *
 * Representation: an operand becomes 8 limbs of 48 bits (8 x 48 = 384, so R is
 * unchanged) held as integer-valued doubles: the limb's bits OR the bits of 2^52,
 * read as a double, minus 2^52 (no int-to-float conversion instruction).
 *
 * Exact split of one product a * b < 2^100 (a, b integers), with round-toward-zero FMAs:
 *   h = fma_rz(a, b, 2^100)   in [2^100, 2^101), where the ulp is 2^48: h = 2^100 + hi 2^48,
 *                             hi = floor(a b / 2^48);
 *   t = (2^100 + 2^52) - h    = 2^52 - hi 2^48: a multiple of 2^48 below 2^97, exact;
 *   l = fma_rz(a, b, t)       = 2^52 + lo, lo = a b mod 2^48 < 2^48: exact (ulp 1).
 * So bits(h) = bits(2^100) + hi and bits(l) = bits(2^52) + lo as 64-bit integers: each
 * product adds bits(l) - bits(2^52) to column k and bits(h) - bits(2^100) to column
 * k + 1 of uint64 accumulators (wrap-around adds; the compiler folds the constants).
 * For a Montgomery digit m times a limb p_j of the modulus the FMA takes x = 2^52 + m
 * as it comes out of the integer bits (no subtraction) and the addends absorb the
 * 2^52 p_j: fma_rz(x, p_j, 2^100 - 2^52 p_j) = 2^100 + m p_j before rounding, and
 * t' = (2^100 + 2^52 - 2^52 p_j) - h = 2^48 (16 - 16 p_j - hi) is exact (|.| < 2^101,
 * a multiple of 2^48), so l = fma_rz(x, p_j, t') = 2^52 + lo as above. Every addend
 * here is a compile-time constant.
 *
 * Montgomery reduction, word by word in radix 2^48: with T_i the (complete) column i,
 * m_i = T_i (-p^-1) mod 2^48 (three IMADs: the top 48 bits of T_i (-p^-1 2^16) mod 2^64,
 * which land where the double's bits want them), and m_i p adds m_i p_j to columns i + j.
 * The low half of m_i p_0 is (-T_i) mod 2^48 by construction, so it is not computed:
 * column i becomes a multiple of 2^48 and carries ceil(T_i / 2^48) into column i + 1.
 *
 * Bounds (why nothing is lost): limbs are < 2^48 (2 a_j < 2^49 in the square), so every
 * product is < 2^97 and its split is exact. A column receives at most 8 lows and 8 highs
 * of the product, 8 lows and 8 highs of the reduction (each < 2^49) and a carry
 * < 2^6: every true column value is < 2^55, far from 2^64, so the wrap-around sums are
 * exact. The result, sum_k T_(8+k) 2^(48 k) = (a b + m p) / 2^384 < 2p for a, b < p
 * (m < 2^384), is carried into 48-bit limbs, repacked into 12 words and made canonical
 * by one conditional subtraction of p (fp_t::final_sub).
 *
 * Host build: the same code with fma_rz emulated exactly on __int128 (a b + c computed
 * exactly, truncated toward zero to 53 significant bits; valid for the integer-valued
 * operands used here, |a b + c| < 2^127) and bit casts by memcpy, so the host results are
 * the device results.
 */
#pragma once
#include "fp.cuh"

namespace fq_dfma {

constexpr int L = 8;                                 /* 48-bit limbs */
constexpr uint64_t MASK48 = 0xffffffffffffull;
constexpr uint64_t BITS52 = 0x4330000000000000ull;   /* bits of 2^52 */
constexpr uint64_t BITS100 = 0x4630000000000000ull;  /* bits of 2^100 */
constexpr uint32_t HI52 = 0x43300000u;               /* high word of bits(2^52) */
constexpr double TWO52 = 4503599627370496.0;
constexpr double TWO100 = 1267650600228229401496703205376.0;
constexpr double C2 = TWO100 + TWO52;                /* exact: 49 significant bits */
constexpr uint64_t PINV = FQ_M0_64 & MASK48;         /* -p^-1 mod 2^48 */

/* ------------------------------------------------------------ primitives */
FF_INLINE double fma_rz(double a, double b, double c) {
#ifdef __CUDA_ARCH__
    return __fma_rz(a, b, c);
#else
    /* a, b, c integer-valued, a, b >= 0, |a b + c| < 2^127: the exact sum, truncated. */
    __int128 s = (__int128)((unsigned __int128)(uint64_t)a * (uint64_t)b) + (__int128)c;
    bool neg = s < 0;
    unsigned __int128 m = neg ? (unsigned __int128)0 - (unsigned __int128)s : (unsigned __int128)s;
    int n = 0;
    for (unsigned __int128 v = m; v; v >>= 1) n++;
    if (n > 53) m = (m >> (n - 53)) << (n - 53);
    double r = (double)m; /* at most 53 significant bits: exact */
    return neg ? -r : r;
#endif
}
FF_INLINE double dsub(double a, double b) {
#ifdef __CUDA_ARCH__
    return __dsub_rn(a, b);
#else
    return a - b;
#endif
}
FF_INLINE uint64_t bits(double x) {
#ifdef __CUDA_ARCH__
    return (uint64_t)__double_as_longlong(x);
#else
    uint64_t u;
    __builtin_memcpy(&u, &x, 8);
    return u;
#endif
}
FF_INLINE double from_words(uint32_t hi, uint32_t lo) {
#ifdef __CUDA_ARCH__
    return __hiloint2double((int)hi, (int)lo);
#else
    uint64_t u = ((uint64_t)hi << 32) | lo;
    double x;
    __builtin_memcpy(&x, &u, 8);
    return x;
#endif
}

/* ------------------------------------------------------------ limbs */
/* (w & 0xffff) | bits 16..31 of c: one PRMT on the device. */
FF_INLINE uint32_t low16_with(uint32_t w, uint32_t c) {
#ifdef __CUDA_ARCH__
    return __byte_perm(w, c, 0x7610);
#else
    return (w & 0xffffu) | (c & 0xffff0000u);
#endif
}
/* The 48-bit limbs as integer-valued doubles: (limb | bits(2^52)) - 2^52, exact. Limb k
 * starts at word 3k/2 (k even) or at bit 16 of word (3k-1)/2 (k odd). */
FF_INLINE void to_limbs(const uint32_t* w, double* x) {
#pragma unroll
    for (int k = 0; k < L; k++) {
        int j = k % 2 == 0 ? 3 * k / 2 : (3 * k - 1) / 2;
        uint32_t hi = k % 2 == 0 ? low16_with(w[j + 1], HI52) : (w[j + 1] >> 16) | HI52;
        uint32_t lo = k % 2 == 0 ? w[j] : (w[j] >> 16) | (w[j + 1] << 16);
        x[k] = from_words(hi, lo) - TWO52;
    }
}
/* p's limbs p_j, 2^100 - 2^52 p_j and 2^100 + 2^52 - 2^52 p_j as doubles (exact: integers
 * below 2^101 with at most 49 significant bits), computed at compile time. On the device
 * they sit in constant memory, which a DFMA / DADD reads as an operand (as literals they
 * are rebuilt in registers inside the loop: DFMA has no 64-bit immediate). */
constexpr uint32_t P_WORDS[12] = {FQ_MOD};
constexpr double p_limb_c(int j) {
    return (double)(j % 2 == 0 ? P_WORDS[3 * j / 2] | (uint64_t)(P_WORDS[3 * j / 2 + 1] & 0xffffu) << 32
                               : (P_WORDS[3 * j / 2] >> 16) | (uint64_t)P_WORDS[3 * j / 2 + 1] << 16);
}
constexpr double p_k1_c(int j) { return TWO100 - TWO52 * p_limb_c(j); }
constexpr double p_k2_c(int j) { return C2 - TWO52 * p_limb_c(j); }
#ifdef __CUDA_ARCH__
__constant__ double P_K1[L] = {p_k1_c(0), p_k1_c(1), p_k1_c(2), p_k1_c(3),
                               p_k1_c(4), p_k1_c(5), p_k1_c(6), p_k1_c(7)};
__constant__ double P_K2[L] = {p_k2_c(0), p_k2_c(1), p_k2_c(2), p_k2_c(3),
                               p_k2_c(4), p_k2_c(5), p_k2_c(6), p_k2_c(7)};
__constant__ double P_L[L] = {p_limb_c(0), p_limb_c(1), p_limb_c(2), p_limb_c(3),
                              p_limb_c(4), p_limb_c(5), p_limb_c(6), p_limb_c(7)};
#endif
/* The constant table on the device, its compile-time function on the host. */
#ifdef __CUDA_ARCH__
#define DFMA_CONST(table, fn, j) table[j]
#else
#define DFMA_CONST(table, fn, j) fn(j)
#endif
FF_INLINE double p_limb(int j) { return DFMA_CONST(P_L, p_limb_c, j); }
FF_INLINE double p_k1(int j) { return DFMA_CONST(P_K1, p_k1_c, j); }
FF_INLINE double p_k2(int j) { return DFMA_CONST(P_K2, p_k2_c, j); }
#undef DFMA_CONST

/* ------------------------------------------------------------ products into columns */
/* T[k] += a b mod 2^48, T[k + 1] += floor(a b / 2^48), for integers a, b with a b < 2^100. */
FF_INLINE void mac(uint64_t* T, int k, double a, double b) {
    double h = fma_rz(a, b, TWO100);
    double l = fma_rz(a, b, dsub(C2, h));
    T[k] += bits(l) - BITS52;
    T[k + 1] += bits(h) - BITS100;
}
/* The same for m p_j with x = 2^52 + m (constant addends absorb the 2^52). */
FF_INLINE void mac_p(uint64_t* T, int k, double x, int j) {
    double h = fma_rz(x, p_limb(j), p_k1(j));
    double l = fma_rz(x, p_limb(j), dsub(p_k2(j), h));
    T[k] += bits(l) - BITS52;
    T[k + 1] += bits(h) - BITS100;
}
/* One reduction step on the complete column i: adds m_i p, leaving column i a multiple
 * of 2^48 whose quotient is carried into column i + 1. */
FF_INLINE void redc_step(uint64_t* T, int i) {
    uint64_t ti = T[i];
    uint64_t m = ti * (PINV << 16); /* m_i 2^16 mod 2^64: m_i is its top 48 bits */
    double x = from_words((uint32_t)(m >> 48) | HI52, (uint32_t)(m >> 16)); /* 2^52 + m_i */
    T[i + 1] += (ti + MASK48) >> 48; /* (T_i + (m_i p_0 mod 2^48)) / 2^48 */
    T[i + 1] += bits(fma_rz(x, p_limb(0), p_k1(0))) - BITS100;
#pragma unroll
    for (int j = 1; j < L; j++) mac_p(T, i + j, x, j);
}
/* Columns 0..15 of the product in, a * b * 2^-384 mod p (canonical) out. */
FF_INLINE fp_t reduce(uint64_t* T) {
#pragma unroll
    for (int i = 0; i < L; i++) redc_step(T, i);
    uint64_t v[L];
    uint64_t c = 0;
#pragma unroll
    for (int k = 0; k < L; k++) {
        uint64_t s = T[L + k] + c;
        c = s >> 48;
        v[k] = k < L - 1 ? s & MASK48 : s;
    }
    fp_t r;
#pragma unroll
    for (int k = 0; k < L; k += 2) {
        int j = 3 * k / 2;
        r.l[j] = (uint32_t)v[k];
        r.l[j + 1] = (uint32_t)(v[k] >> 32) | ((uint32_t)v[k + 1] << 16);
        r.l[j + 2] = (uint32_t)(v[k + 1] >> 16);
    }
    fp_t::final_sub(r.l);
    return r;
}

/* ------------------------------------------------------------ the product a * b */
/* Columns of a * b with the 64 limb products on the FP64 pipe. */
FF_INLINE void product_fp(uint64_t* T, const uint32_t* a, const uint32_t* b) {
    double x[L], y[L];
    to_limbs(a, x);
    to_limbs(b, y);
#pragma unroll
    for (int k = 0; k < 2 * L; k++) T[k] = 0;
#pragma unroll
    for (int i = 0; i < L; i++) {
#pragma unroll
        for (int j = 0; j < L; j++) mac(T, i + j, x[i], y[j]);
    }
}
/* Columns of a^2: a_i a_j (i < j) once through the doubled limb 2 a_j (< 2^49, exact). */
FF_INLINE void square_fp(uint64_t* T, const uint32_t* a) {
    double x[L], x2[L];
    to_limbs(a, x);
#pragma unroll
    for (int k = 0; k < L; k++) x2[k] = x[k] + x[k];
#pragma unroll
    for (int k = 0; k < 2 * L; k++) T[k] = 0;
#pragma unroll
    for (int i = 0; i < L; i++) {
        mac(T, 2 * i, x[i], x[i]);
#pragma unroll
        for (int j = i + 1; j < L; j++) mac(T, i + j, x[i], x2[j]);
    }
}

}  // namespace fq_dfma

/* a * b * 2^-384 mod p, as fp_t's a * b. */
FF_INLINE fp_t fq_mul_dfma(const fp_t& a, const fp_t& b) {
    uint64_t T[2 * fq_dfma::L];
    fq_dfma::product_fp(T, a.l, b.l);
    return fq_dfma::reduce(T);
}

/* a^2 * 2^-384 mod p, as fp_t's a.sqr(). */
FF_INLINE fp_t fq_sqr_dfma(const fp_t& a) {
    uint64_t T[2 * fq_dfma::L];
    fq_dfma::square_fp(T, a.l);
    return fq_dfma::reduce(T);
}
