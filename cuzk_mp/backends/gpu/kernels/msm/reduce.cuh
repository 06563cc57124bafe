/* From buckets to window sums: bucket-sum reduction and group sums (the Horner step over
 * the windows runs on the host, msm.py). All XYZZ, storage as in xyzz.cuh.
 *
 * A window's buckets hold B_k for digit magnitude k = 1 .. nb (nb = 2^(c-1)) at
 * index k - 1; the window sum is sum_k k B_k. A thread takes `chunk` consecutive
 * magnitudes lo .. lo + chunk - 1 and runs the classic running sum from the top:
 * S += B_k, T += S, which leaves T = sum_k (k - lo + 1) B_k and S = sum_k B_k, so
 * its share is T + (lo - 1) S (2 additions per bucket plus one ~c-bit scalar
 * multiplication per thread). The shares are then summed per window by
 * msm_sum_groups_body.
 */
#pragma once
#include "../ec/xyzz.cuh"

template <class F>
FF_INLINE void msm_bucket_reduce_body(uint64_t t, const uint64_t* buckets, uint64_t* out, uint32_t nb,
                                      uint32_t chunk) {
    const int XW = xyzz_t<F>::WORDS;
    uint64_t per = nb / chunk, w = t / per, j = t % per;
    const uint64_t* base = buckets + (w * nb + j * chunk) * XW;
    xyzz_t<F> S = xyzz_t<F>::inf(), T = xyzz_t<F>::inf();
#pragma unroll 1
    for (int64_t i = (int64_t)chunk - 1; i >= 0; i--) {
        S.add(xyzz_t<F>::load(base + i * XW));
        T.add(S);
    }
    T.add(S.mul_small((uint32_t)(j * chunk)));
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

/* acc[t] += in[t]: two bucket sets of the same windows made one (precomputed multiples,
 * where every window batch accumulates a set of its own). */
template <class F>
FF_INLINE void msm_add_sets_body(uint64_t t, const uint64_t* in, uint64_t* acc) {
    const int XW = xyzz_t<F>::WORDS;
    xyzz_t<F> x = xyzz_t<F>::load(acc + t * XW);
    x.add(xyzz_t<F>::load(in + t * XW));
    x.store(acc + t * XW);
}
