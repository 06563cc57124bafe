/* Radix-2^k NTT passes over Fr with shared-memory tiles (one pass = k radix-2 stages).
 *
 * A transform of size n = 2^lg is a sequence of passes, each doing the stages on
 * bit range [s_lo, s_lo + k) of the element index idx = hi | mid << s_lo | lo:
 * for every (hi, lo) it is a size-K = 2^k DFT over `mid` plus an "outer" twiddle
 * w_M^(lo * f) with M = 2^(s_lo + k) (the four-step decomposition
 * X[f + K g] = sum_lo w_L^(lo g) w_M^(lo f) DFT_K(x[., lo])[f]).
 *   DIF pass (natural -> bit-reversed, passes from the top bits down): sub-DFT
 *     with bit-reversed output (f = bitrev_k(mid)), then the outer twiddle.
 *   DIT pass (bit-reversed -> natural, passes from bit 0 up): outer twiddle on the
 *     input (b = bitrev_k(mid)), then the sub-DFT with natural output.
 * No bit-reversal pass is needed for H: iNTT by DIF leaves coefficients in
 * bit-reversed order, the coset scaling indexes its table by bitrev(position),
 * and the forward NTT by DIT takes bit-reversed input and writes natural order.
 *
 * Tile of a block: K mids x C consecutive lo values (C = 2^min(s_lo, NTT_CHUNK_LG),
 * so global accesses are C * 32 contiguous bytes), K * C <= 2^NTT_TILE_LG.
 * Tables (Montgomery fr, (m, 4) uint64):
 *   tw_half[i] = w^i, i < n/2, w = the forward root: the outer twiddles of both
 *     directions (fr_root_pow), one load and no multiply per element and pass;
 *   tw_in[j] = w^(j 2^(lg - in_lg)), j < 2^(in_lg - 1), w of this direction: the
 *     sub-DFT twiddles (small, stays in L1);
 *   co_lo/co_hi: two-level table of g^e / n for the coset scaling (DIF s_lo = 0 pass).
 * Stage s = 0 of every sub-DFT has only the twiddle 1 and skips the multiply.
 */
#include "fr_io.cuh"

#ifndef NTT_TILE_LG
#define NTT_TILE_LG 10
#endif
#ifndef NTT_CHUNK_LG
#define NTT_CHUNK_LG 2
#endif
#ifndef NTT_THREADS
#define NTT_THREADS 256
#endif
#if NTT_TILE_LG < 4 || NTT_TILE_LG > 10
#error "bad NTT_TILE_LG: 2^NTT_TILE_LG * 32 bytes of static shared memory, 4..10"
#endif
#if NTT_CHUNK_LG < 0 || NTT_CHUNK_LG > 4 || NTT_CHUNK_LG >= NTT_TILE_LG
#error "bad NTT_CHUNK_LG value (0..4)"
#endif

/* One radix-2 stage s of the in-tile sub-DFT (DIF or DIT butterfly). */
DEV_INLINE void ntt_tile_stage(uint4* sh_lo, uint4* sh_hi, uint32_t tile, uint32_t c_lg, uint32_t s,
                               bool dit, const uint64_t* tw_in, uint32_t in_lg) {
    const uint32_t h = 1u << s;
    for (uint32_t q = threadIdx.x; q < tile / 2; q += NTT_THREADS) {
        uint32_t c = q & ((1u << c_lg) - 1);
        uint32_t m = q >> c_lg;                       /* mid with bit s removed */
        uint32_t j = m & (h - 1);
        uint32_t mid0 = ((m >> s) << (s + 1)) | j;
        uint32_t e0 = (mid0 << c_lg) | c;
        uint32_t e1 = e0 + (h << c_lg);
        fr_t u = fr_ld_shared(sh_lo, sh_hi, e0);
        fr_t v = fr_ld_shared(sh_lo, sh_hi, e1);
        if (s == 0) {  /* w_2^0 = 1 */
            fr_st_shared(sh_lo, sh_hi, e0, u + v);
            fr_st_shared(sh_lo, sh_hi, e1, u - v);
            continue;
        }
        fr_t w = fr_ld_table(tw_in, j << (in_lg - 1 - s));  /* w_{2h}^j */
        if (dit) {
            v = v * w;
            fr_st_shared(sh_lo, sh_hi, e0, u + v);
            fr_st_shared(sh_lo, sh_hi, e1, u - v);
        } else {
            fr_st_shared(sh_lo, sh_hi, e0, u + v);
            fr_st_shared(sh_lo, sh_hi, e1, (u - v) * w);
        }
    }
}

/* grid: n / (K * C) blocks of NTT_THREADS; in place on d ((n, 4) uint64, Montgomery).
 * use_coset (DIF, s_lo == 0 only): position p is multiplied by co(bitrev_lg(p)). */
extern "C" __global__ void __launch_bounds__(NTT_THREADS)
ntt_pass(uint64_t* d, uint32_t lg, uint32_t s_lo, uint32_t k, uint32_t dit, uint32_t inverse,
         const uint64_t* tw_half, const uint64_t* tw_in, uint32_t in_lg,
         uint32_t use_coset, const uint64_t* co_lo, const uint64_t* co_hi, uint32_t co_b) {
    __shared__ uint4 sh_lo[1 << NTT_TILE_LG];
    __shared__ uint4 sh_hi[1 << NTT_TILE_LG];
    const uint32_t c_lg = s_lo < NTT_CHUNK_LG ? s_lo : NTT_CHUNK_LG;
    const uint32_t tile = 1u << (k + c_lg);
    const uint32_t chunks = 1u << (s_lo - c_lg);           /* lo chunks per hi */
    const uint32_t t = blockIdx.x;
    const size_t base = ((size_t)(t >> (s_lo - c_lg)) << (s_lo + k)) | ((size_t)(t & (chunks - 1)) << c_lg);
    const uint32_t tw_shift = lg - s_lo - k;                /* w_M = w^(2^tw_shift) */
    const bool outer = s_lo > 0;

    for (uint32_t e = threadIdx.x; e < tile; e += NTT_THREADS) {
        uint32_t c = e & ((1u << c_lg) - 1), mid = e >> c_lg;
        size_t idx = base + ((size_t)mid << s_lo) + c;
        fr_t v = fr_ld_global(d, idx);
        if (dit && outer) {
            uint32_t lo = (uint32_t)(idx & ((1u << s_lo) - 1));
            v = v * fr_root_pow(tw_half, lg, (lo * bit_reverse(mid, k)) << tw_shift, inverse);
        }
        fr_st_shared(sh_lo, sh_hi, e, v);
    }
    __syncthreads();
    for (uint32_t i = 0; i < k; i++) {
        ntt_tile_stage(sh_lo, sh_hi, tile, c_lg, dit ? i : k - 1 - i, dit, tw_in, in_lg);
        __syncthreads();
    }
    for (uint32_t e = threadIdx.x; e < tile; e += NTT_THREADS) {
        uint32_t c = e & ((1u << c_lg) - 1), mid = e >> c_lg;
        size_t idx = base + ((size_t)mid << s_lo) + c;
        fr_t v = fr_ld_shared(sh_lo, sh_hi, e);
        if (!dit && outer) {
            uint32_t lo = (uint32_t)(idx & ((1u << s_lo) - 1));
            v = v * fr_root_pow(tw_half, lg, (lo * bit_reverse(mid, k)) << tw_shift, inverse);
        }
        if (use_coset) v = v * fr_twiddle(co_lo, co_hi, co_b, bit_reverse((uint32_t)idx, lg));
        fr_st_global(d, idx, v);
    }
}

/* grid: ceil(count / NTT_THREADS); out[i] = lo[i mod 2^b] * hi[i >> b] (a full power table
 * from its two-level form), i < count. */
extern "C" __global__ void __launch_bounds__(NTT_THREADS)
ntt_expand_powers(uint64_t* out, uint32_t count, const uint64_t* lo, const uint64_t* hi, uint32_t b) {
    uint32_t i = blockIdx.x * NTT_THREADS + threadIdx.x;
    if (i < count) fr_st_global(out, i, fr_twiddle(lo, hi, b, i));
}

/* grid: ceil(n / NTT_THREADS); in place: swaps rows i and bitrev_lg(i), times scale[0]
 * when use_scale (the 1/n of a standalone inverse transform). lg >= 1. */
extern "C" __global__ void __launch_bounds__(NTT_THREADS)
ntt_bit_reverse(uint64_t* d, uint32_t lg, uint32_t use_scale, const uint64_t* scale) {
    uint32_t i = blockIdx.x * NTT_THREADS + threadIdx.x;
    if (i >= (1u << lg)) return;
    uint32_t j = bit_reverse(i, lg);
    if (i > j) return;
    fr_t a = fr_ld_global(d, i), b = fr_ld_global(d, j);
    if (use_scale) {
        fr_t s = fr_ld_table(scale, 0);
        a = a * s;
        b = b * s;
    }
    fr_st_global(d, i, b);
    if (i != j) fr_st_global(d, j, a);
}
