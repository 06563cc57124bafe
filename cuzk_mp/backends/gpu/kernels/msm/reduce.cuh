/* From buckets to window sums: bucket-sum reduction and group sums (the Horner step over
 * the windows runs on the host, msm.py). All XYZZ, storage as in xyzz.cuh.
 *
 * A window's buckets hold B_k for digit magnitude k = 1 .. nb (nb = 2^(c-1)) at
 * index k - 1; the window sum is sum_k k B_k. Thread j of a window takes `chunk`
 * consecutive magnitudes lo .. lo + chunk - 1 (lo = j chunk + 1) and runs the classic
 * running sum from the top: S += B_k, T += S, which leaves T = sum_k (k - lo + 1) B_k and
 * S_j = sum_k B_k, so its share of the window sum is T + j chunk S_j.
 *
 * Two ways to add the j chunk S_j terms (msm_passes._window_sums):
 *  - in the thread (`sums` null): one scalar multiplication by j chunk, ~log2(nb) doublings
 *    and half as many additions after the 2 chunk additions of the running sum (a quarter of
 *    a 64-bucket chunk's work);
 *  - as a second reduction (`sums` given): the thread stores S_j with weight j, i.e. at index
 *    j - 1 of its window's nb / chunk "buckets" (thread 0, whose weight is 0, stores the point
 *    at infinity at the last index instead), so that the same reduction over them gives
 *    Q = sum_j j S_j, and the window sum is sum_j T_j + chunk Q (msm_add_sets_body with
 *    shift log2(chunk)): 2 additions a chunk instead of a scalar multiplication.
 */
#pragma once
#include "../ec/xyzz.cuh"

template <class F>
FF_INLINE void msm_bucket_reduce_body(uint64_t t, const uint64_t* buckets, uint64_t* out, uint64_t* sums,
                                      uint32_t nb, uint32_t chunk) {
    const int XW = xyzz_t<F>::WORDS;
    uint64_t per = nb / chunk, w = t / per, j = t % per;
    const uint64_t* base = buckets + (w * nb + j * chunk) * XW;
    xyzz_t<F> S = xyzz_t<F>::inf(), T = xyzz_t<F>::inf();
#pragma unroll 1
    for (int64_t i = (int64_t)chunk - 1; i >= 0; i--) {
        S.add(xyzz_t<F>::load(base + i * XW));
        T.add(S);
    }
    if (sums == nullptr) {
        T.add(S.mul_small((uint32_t)(j * chunk)));
    } else if (j > 0) {
        S.store(sums + (w * per + j - 1) * XW);
    } else {
        xyzz_t<F>::inf().store(sums + (w * per + per - 1) * XW);
    }
    T.store(out + t * XW);
}

/* out[t] = sum of in[t group .. min((t + 1) group, n)). */
template <class F>
FF_INLINE void msm_sum_groups_body(uint64_t t, const uint64_t* in, uint64_t* out, uint64_t n,
                                   uint32_t group) {
    const int XW = xyzz_t<F>::WORDS;
    uint64_t j0 = t * group, j1 = j0 + group < n ? j0 + group : n;
    xyzz_t<F> acc = xyzz_t<F>::inf();
#pragma unroll 1
    for (uint64_t j = j0; j < j1; j++) acc.add(xyzz_t<F>::load(in + j * XW));
    acc.store(out + t * XW);
}

/* acc[t] += 2^shift in[t]: two bucket sets of the same windows made one (precomputed
 * multiples, where every window batch accumulates a set of its own; shift 0), or a window's
 * second reduction added to its first (shift log2(chunk): msm_bucket_reduce_body). */
template <class F>
FF_INLINE void msm_add_sets_body(uint64_t t, const uint64_t* in, uint64_t* acc, uint32_t shift) {
    const int XW = xyzz_t<F>::WORDS;
    xyzz_t<F> x = xyzz_t<F>::load(acc + t * XW);
    xyzz_t<F> y = xyzz_t<F>::load(in + t * XW);
#pragma unroll 1
    for (uint32_t i = 0; i < shift; i++) y.dbl();
    x.add(y);
    x.store(acc + t * XW);
}
