/* Multiply-throughput kernels for perf/gpu_bench.py (not used by the prover).
 *
 * grid: any; block: FF_BENCH_THREADS. Thread i loads x = a[i], y = a[(i + 1) % n]
 * and runs `iters` dependent steps x = x * y (CHAINS independent chains per thread
 * for latency hiding), storing x so nothing is dead code. The host checks a few
 * rows against Python ints (x * y^iters * R^-iters) and divides
 * threads * iters * CHAINS by the event-timed kernel time.
 *   ff_bench_fq / ff_bench_fr: mont_t (12 / 8 x 32-bit words, even/odd PTX CIOS)
 *   ff_bench_fq2: fp2_t Karatsuba multiply (3 Fq mul + 5 add/sub)
 *   ff_bench_fq_sqr / ff_bench_fr_sqr: x = x.sqr() (the dedicated squaring), y unused
 * (The plain 64-bit-limb CIOS baseline of perf/gpu_notes.md, 1.64e10 Fq mul/s, is gone: NVRTC 13
 * refuses unsigned __int128 in device code.)
 */
#include "fp2.cuh"
#include "fr.cuh"

#ifndef FF_BENCH_THREADS
#define FF_BENCH_THREADS 256
#endif
#ifndef FF_BENCH_CHAINS
#define FF_BENCH_CHAINS 1
#endif

template <class T, int W, bool SQR = false>
DEV_INLINE void bench_chain(const uint64_t* a, uint64_t* out, uint64_t n, uint32_t iters) {
    size_t i = (size_t)blockIdx.x * FF_BENCH_THREADS + threadIdx.x;
    if (i >= n) return;
    T y = T::load(a + W * ((i + 1) % n));
    T x[FF_BENCH_CHAINS];
#pragma unroll
    for (int c = 0; c < FF_BENCH_CHAINS; c++) x[c] = T::load(a + W * i);
#pragma unroll 1
    for (uint32_t k = 0; k < iters; k++) {
#pragma unroll
        for (int c = 0; c < FF_BENCH_CHAINS; c++) x[c] = SQR ? x[c].sqr() : x[c] * y;
    }
    T acc = x[0];
#pragma unroll
    for (int c = 1; c < FF_BENCH_CHAINS; c++) acc = acc + x[c];
    acc.store(out + W * i);
}

extern "C" __global__ void __launch_bounds__(FF_BENCH_THREADS)
ff_bench_fq(const uint64_t* a, uint64_t* out, uint64_t n, uint32_t iters) { bench_chain<fp_t, 6>(a, out, n, iters); }
extern "C" __global__ void __launch_bounds__(FF_BENCH_THREADS)
ff_bench_fr(const uint64_t* a, uint64_t* out, uint64_t n, uint32_t iters) { bench_chain<fr_t, 4>(a, out, n, iters); }
extern "C" __global__ void __launch_bounds__(FF_BENCH_THREADS)
ff_bench_fq_sqr(const uint64_t* a, uint64_t* out, uint64_t n, uint32_t iters) {
    bench_chain<fp_t, 6, true>(a, out, n, iters);
}
extern "C" __global__ void __launch_bounds__(FF_BENCH_THREADS)
ff_bench_fr_sqr(const uint64_t* a, uint64_t* out, uint64_t n, uint32_t iters) {
    bench_chain<fr_t, 4, true>(a, out, n, iters);
}
extern "C" __global__ void __launch_bounds__(FF_BENCH_THREADS)
ff_bench_fq2(const uint64_t* a, uint64_t* out, uint64_t n, uint32_t iters) { bench_chain<fp2_t, 12>(a, out, n, iters); }
