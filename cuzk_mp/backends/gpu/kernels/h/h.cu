/* The last step of the Groth16 H computation: p = a * b - c on the odd coset,
 * converted to standard form (the H MSM's scalars; snarkjs groth16_prove.js
 * steps 2-3, after the coset NTTs of ntt/ntt.cu).
 */
#include "../ntt/fr_io.cuh"

#ifndef H_THREADS
#define H_THREADS 256
#endif

/* grid: ceil(n / H_THREADS); a, b, c: (n, 4) uint64 Montgomery; out may alias a. */
extern "C" __global__ void __launch_bounds__(H_THREADS)
h_combine(const uint64_t* a, const uint64_t* b, const uint64_t* c, uint64_t* out, uint64_t n) {
    size_t i = (size_t)blockIdx.x * H_THREADS + threadIdx.x;
    if (i >= n) return;
    fr_t p = fr_ld_global(a, i) * fr_ld_global(b, i) - fr_ld_global(c, i);
    fr_st_global(out, i, p.from_mont());
}
