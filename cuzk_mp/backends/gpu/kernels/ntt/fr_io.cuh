/* fr_t moves between global memory, shared memory and twiddle tables.
 *
 * Global Fr arrays are (n, 4) uint64 rows, 32-byte aligned (CuPy allocations are
 * 256-byte aligned), read and written as two 16-byte vectors. In shared memory an
 * element is split into two uint4 planes (words 0-3 and 4-7), so consecutive
 * elements are 16 bytes apart in each plane and a warp's 16-byte accesses are
 * bank-conflict free (a 32-byte stride would be 2-way conflicted).
 */
#pragma once
#include "../ff/fr.cuh"

DEV_INLINE fr_t fr_from_u4(uint4 a, uint4 b) {
    fr_t r;
    r.l[0] = a.x; r.l[1] = a.y; r.l[2] = a.z; r.l[3] = a.w;
    r.l[4] = b.x; r.l[5] = b.y; r.l[6] = b.z; r.l[7] = b.w;
    return r;
}
DEV_INLINE uint4 fr_lo_u4(const fr_t& v) { return make_uint4(v.l[0], v.l[1], v.l[2], v.l[3]); }
DEV_INLINE uint4 fr_hi_u4(const fr_t& v) { return make_uint4(v.l[4], v.l[5], v.l[6], v.l[7]); }

/* row idx of a global (n, 4) uint64 array */
DEV_INLINE fr_t fr_ld_global(const uint64_t* d, size_t idx) {
    const uint4* p = reinterpret_cast<const uint4*>(d + idx * 4);
    return fr_from_u4(p[0], p[1]);
}
DEV_INLINE void fr_st_global(uint64_t* d, size_t idx, const fr_t& v) {
    uint4* p = reinterpret_cast<uint4*>(d + idx * 4);
    p[0] = fr_lo_u4(v);
    p[1] = fr_hi_u4(v);
}
/* read-only (twiddle) tables: through the non-coherent cache */
DEV_INLINE fr_t fr_ld_table(const uint64_t* t, uint32_t idx) {
    const uint4* p = reinterpret_cast<const uint4*>(t + (size_t)idx * 4);
    return fr_from_u4(__ldg(p), __ldg(p + 1));
}
DEV_INLINE fr_t fr_ld_shared(const uint4* lo, const uint4* hi, uint32_t e) { return fr_from_u4(lo[e], hi[e]); }
DEV_INLINE void fr_st_shared(uint4* lo, uint4* hi, uint32_t e, const fr_t& v) {
    lo[e] = fr_lo_u4(v);
    hi[e] = fr_hi_u4(v);
}
/* w^E from the two-level table: tw_lo[i] = w^i (i < 2^b), tw_hi[i] = w^(i 2^b). 1M. */
DEV_INLINE fr_t fr_twiddle(const uint64_t* tw_lo, const uint64_t* tw_hi, uint32_t b, uint32_t e) {
    return fr_ld_table(tw_lo, e & ((1u << b) - 1)) * fr_ld_table(tw_hi, e >> b);
}
/* w^e, or w^-e when inverse, for e < 2^lg from the half table tw[i] = w^i (i < 2^(lg-1)):
 * w^-e = w^(n-e), and w^(e + n/2) = -w^e. One table serves both directions. */
DEV_INLINE fr_t fr_root_pow(const uint64_t* tw, uint32_t lg, uint32_t e, bool inverse) {
    const uint32_t n = 1u << lg, half = n >> 1;
    if (inverse) e = (n - e) & (n - 1);
    fr_t v = fr_ld_table(tw, e & (half - 1));
    return e >= half ? v.neg() : v;
}
/* the low `bits` bits of x reversed (bits >= 1) */
DEV_INLINE uint32_t bit_reverse(uint32_t x, uint32_t bits) { return __brev(x) >> (32 - bits); }
