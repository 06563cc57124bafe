/* Batch fixed-base kernels for G1 (default) or G2 (-DFB_G2=1), fixed_base.cuh's bodies.
 *
 * 1-D grids, FB_NTHREADS per block, thread t handles items [t per, min((t + 1) per, n));
 * no shared memory, no inter-thread cooperation. scratch (n, 5 CW) uint64 working
 * memory; out (n, 2 CW) uint64 affine zkey layout (CW = 6 for G1, 12 for G2).
 *   fixed_base_mul   out[i] = scalars[i] G; scalars (n, 4) uint64 (any 256-bit value,
 *                    standard form), table as in fixed_base.cuh. Host side: fixed_base.py.
 *   fixed_base_signed  the same from signed windows of wbits bits (table as in
 *                    fixed_base.cuh, made by fixed_base_mul). Host side: fixed_base.py.
 *   fixed_base_pow2  out[i] = 2^c src[i]; src (n, 2 CW) affine zkey layout. Host side:
 *                    msm.py (precomputed multiples of key points).
 */
#include "fixed_base.cuh"

#ifndef FB_G2
#define FB_G2 0
#endif
#if FB_G2
typedef fp2_t fb_field_t;
#else
typedef fp_t fb_field_t;
#endif

#ifndef FB_NTHREADS
#define FB_NTHREADS 128
#endif
#if FB_NTHREADS % 32 != 0 || FB_NTHREADS > 1024
#error "FB_NTHREADS must be a multiple of 32, at most 1024"
#endif

extern "C" __global__ void __launch_bounds__(FB_NTHREADS)
fixed_base_mul(const uint64_t* scalars, const uint64_t* table, uint64_t* out, uint64_t* scratch, uint64_t n,
               uint32_t per) {
    uint64_t t = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t * per < n) fixed_base_body<fb_field_t>(t, scalars, table, out, scratch, n, per);
}

extern "C" __global__ void __launch_bounds__(FB_NTHREADS)
fixed_base_signed(const uint64_t* scalars, const uint64_t* table, uint64_t* out, uint64_t* scratch, uint64_t n,
                  uint32_t per, uint32_t wbits) {
    uint64_t t = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t * per < n) fixed_base_signed_body<fb_field_t>(t, scalars, table, out, scratch, n, per, wbits);
}

extern "C" __global__ void __launch_bounds__(FB_NTHREADS)
fixed_base_pow2(const uint64_t* src, uint64_t* out, uint64_t* scratch, uint64_t n, uint32_t per, uint32_t c) {
    uint64_t t = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t * per < n) pow2_body<fb_field_t>(t, src, out, scratch, n, per, c);
}
