/* Carry-chain primitives on 32-bit words: PTX on the device, portable C++ on the host.
 *
 * On the device each helper is one PTX instruction (add.cc, addc.cc, mad.lo.cc,
 * madc.hi.cc, ...) and the carry travels in the condition-code register between
 * consecutive `asm volatile` statements, so a chain must be straight-line code of
 * these helpers only (the volatile keeps NVVM from reordering them). The `cc_t&`
 * argument is the host's stand-in for that register: the host path reads and
 * writes it exactly as the instruction reads and writes CC.CF, so the same field
 * code runs, and is tested, on a CPU. On the device the argument is dead and
 * compiles away.
 *
 * Naming follows PTX: `c` prefix = consumes the carry, `_cc` suffix = produces one.
 * Subtraction chains carry a borrow (CF = 1 means borrow), as PTX sub.cc/subc do.
 */
#pragma once
#include "types.cuh"

namespace ptx {

struct cc_t {
    uint32_t cf;
};

#ifdef __CUDA_ARCH__

#define PTX_OP2(name, op)                                                          \
    DEV_INLINE uint32_t name(uint32_t a, uint32_t b, cc_t&) {                      \
        uint32_t r;                                                                \
        asm volatile(op " %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));                \
        return r;                                                                  \
    }
#define PTX_OP3(name, op)                                                          \
    DEV_INLINE uint32_t name(uint32_t a, uint32_t b, uint32_t c, cc_t&) {          \
        uint32_t r;                                                                \
        asm volatile(op " %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));    \
        return r;                                                                  \
    }

PTX_OP2(add_cc, "add.cc.u32")
PTX_OP2(addc_cc, "addc.cc.u32")
PTX_OP2(addc, "addc.u32")
PTX_OP2(sub_cc, "sub.cc.u32")
PTX_OP2(subc_cc, "subc.cc.u32")
PTX_OP2(subc, "subc.u32")
PTX_OP3(mad_lo_cc, "mad.lo.cc.u32")
PTX_OP3(mad_hi_cc, "mad.hi.cc.u32")
PTX_OP3(madc_lo_cc, "madc.lo.cc.u32")
PTX_OP3(madc_hi_cc, "madc.hi.cc.u32")
PTX_OP3(madc_hi, "madc.hi.u32")
PTX_OP3(madc_lo, "madc.lo.u32")

#undef PTX_OP2
#undef PTX_OP3

#else  /* host fallback: explicit carry flag */

inline uint32_t add_cc(uint32_t a, uint32_t b, cc_t& c) {
    uint64_t s = (uint64_t)a + b;
    c.cf = (uint32_t)(s >> 32);
    return (uint32_t)s;
}
inline uint32_t addc_cc(uint32_t a, uint32_t b, cc_t& c) {
    uint64_t s = (uint64_t)a + b + c.cf;
    c.cf = (uint32_t)(s >> 32);
    return (uint32_t)s;
}
inline uint32_t addc(uint32_t a, uint32_t b, cc_t& c) { return a + b + c.cf; }
inline uint32_t sub_cc(uint32_t a, uint32_t b, cc_t& c) {
    c.cf = a < b;
    return a - b;
}
inline uint32_t subc_cc(uint32_t a, uint32_t b, cc_t& c) {
    uint64_t sub = (uint64_t)b + c.cf;
    uint32_t r = (uint32_t)((uint64_t)a - sub);
    c.cf = (uint64_t)a < sub;
    return r;
}
inline uint32_t subc(uint32_t a, uint32_t b, cc_t& c) { return a - b - c.cf; }
inline uint32_t mad_lo_cc(uint32_t a, uint32_t b, uint32_t d, cc_t& c) {
    return add_cc((uint32_t)((uint64_t)a * b), d, c);
}
inline uint32_t mad_hi_cc(uint32_t a, uint32_t b, uint32_t d, cc_t& c) {
    return add_cc((uint32_t)(((uint64_t)a * b) >> 32), d, c);
}
inline uint32_t madc_lo_cc(uint32_t a, uint32_t b, uint32_t d, cc_t& c) {
    return addc_cc((uint32_t)((uint64_t)a * b), d, c);
}
inline uint32_t madc_hi_cc(uint32_t a, uint32_t b, uint32_t d, cc_t& c) {
    return addc_cc((uint32_t)(((uint64_t)a * b) >> 32), d, c);
}
inline uint32_t madc_hi(uint32_t a, uint32_t b, uint32_t d, cc_t& c) {
    return (uint32_t)(((uint64_t)a * b) >> 32) + d + c.cf;
}
inline uint32_t madc_lo(uint32_t a, uint32_t b, uint32_t d, cc_t& c) {
    return (uint32_t)((uint64_t)a * b) + d + c.cf;
}

#endif

FF_INLINE uint32_t mul_lo(uint32_t a, uint32_t b) { return a * b; }
FF_INLINE uint32_t mul_hi(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
    return __umulhi(a, b);
#else
    return (uint32_t)(((uint64_t)a * b) >> 32);
#endif
}

}  // namespace ptx
