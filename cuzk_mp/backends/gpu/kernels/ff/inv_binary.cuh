/* inv_binary(a): a^-1 in Montgomery form by the binary extended Euclidean algorithm; 0 maps to 0.
 *
 * Variable time, ~2 log2(p) steps of word shifts and subtractions: its chain of dependent
 * operations is several times shorter than mont_t::inv()'s log2(p) dependent squarings,
 * which is what counts where ONE thread inverts while others wait (the top of the grid
 * batch-affine rounds' inversion tree, msm/grid_affine.cuh). It runs on the stored word value w = a R: it
 * yields w^-1 = a^-1 R^-1, and two Montgomery products by R^2 make that a^-1 R, the
 * Montgomery form of a^-1. Needs one spare bit above p (x + p must fit): Fq has 3, Fr 1.
 */
#pragma once
#include "fields.cuh"

namespace inv_binary_detail {

template <int N>
FF_INLINE bool words_are_one(const uint32_t* x) {
    uint32_t acc = x[0] ^ 1u;
#pragma unroll
    for (int i = 1; i < N; i++) acc |= x[i];
    return acc == 0;
}
template <int N>
FF_INLINE void shr1(uint32_t* x) {
#pragma unroll
    for (int i = 0; i < N - 1; i++) x[i] = (x[i] >> 1) | (x[i + 1] << 31);
    x[N - 1] >>= 1;
}
/* x / 2 mod p for x < p: (x + p) / 2 when x is odd */
template <int N>
FF_INLINE void half_mod(uint32_t* x, const uint32_t* P) {
    if (x[0] & 1) {
        ptx::cc_t cc;
        x[0] = ptx::add_cc(x[0], P[0], cc);
#pragma unroll
        for (int i = 1; i < N - 1; i++) x[i] = ptx::addc_cc(x[i], P[i], cc);
        x[N - 1] = ptx::addc(x[N - 1], P[N - 1], cc);
    }
    shr1<N>(x);
}
/* x -= y; the borrow out (all ones when x < y) */
template <int N>
FF_INLINE uint32_t sub_words(uint32_t* x, const uint32_t* y) {
    ptx::cc_t cc;
    x[0] = ptx::sub_cc(x[0], y[0], cc);
#pragma unroll
    for (int i = 1; i < N; i++) x[i] = ptx::subc_cc(x[i], y[i], cc);
    return ptx::subc(0, 0, cc);
}
/* x = x - y mod p for x, y < p */
template <int N>
FF_INLINE void sub_mod(uint32_t* x, const uint32_t* y, const uint32_t* P) {
    uint32_t mask = sub_words<N>(x, y);
    ptx::cc_t cc;
    x[0] = ptx::add_cc(x[0], P[0] & mask, cc);
#pragma unroll
    for (int i = 1; i < N - 1; i++) x[i] = ptx::addc_cc(x[i], P[i] & mask, cc);
    x[N - 1] = ptx::addc(x[N - 1], P[N - 1] & mask, cc);
}

}  // namespace inv_binary_detail

template <class F>
FF_INLINE mont_t<F> inv_binary(const mont_t<F>& a) {
    using namespace inv_binary_detail;
    constexpr int N = mont_t<F>::N;
    if (a.is_zero()) return mont_t<F>::zero();
    uint32_t P[N], u[N], v[N], x1[N], x2[N];
    mont_t<F>::load_mod(P);
#pragma unroll
    for (int i = 0; i < N; i++) {
        u[i] = a.l[i];
        v[i] = P[i];
        x1[i] = 0;
        x2[i] = 0;
    }
    x1[0] = 1; /* invariants: x1 w = u, x2 w = v (mod p); gcd(u, v) = 1 */
#pragma unroll 1
    while (!words_are_one<N>(u) && !words_are_one<N>(v)) {
#pragma unroll 1
        while (!(u[0] & 1)) {
            shr1<N>(u);
            half_mod<N>(x1, P);
        }
#pragma unroll 1
        while (!(v[0] & 1)) {
            shr1<N>(v);
            half_mod<N>(x2, P);
        }
        uint32_t t[N];
#pragma unroll
        for (int i = 0; i < N; i++) t[i] = u[i];
        if (sub_words<N>(t, v) == 0) { /* u >= v */
#pragma unroll
            for (int i = 0; i < N; i++) u[i] = t[i];
            sub_mod<N>(x1, x2, P);
        } else {
            sub_words<N>(v, u);
            sub_mod<N>(x2, x1, P);
        }
    }
    mont_t<F> r, rr;
    const bool one_u = words_are_one<N>(u);
#pragma unroll
    for (int i = 0; i < N; i++) {
        r.l[i] = one_u ? x1[i] : x2[i];
        rr.l[i] = F::rr(i);
    }
    return (r * rr) * rr;
}
