/* Element-wise field operations for the GPU tests (tests/test_gpu_field.py).
 *
 * grid: ceil(n / 256) blocks of 256; a, b, out are (n, W) uint64 with W = 6 (Fq),
 * 4 (Fr) or 12 (Fq2); op codes: 0 mul, 1 add, 2 sub, 3 neg, 4 sqr, 5 dbl, 6 inv,
 * 7 to_mont, 8 from_mont, 9 eq (out[i][0] = a == b), 10 mul_by_nonresidue (Fq2),
 * 11 mul_by_fp (Fq2: a times b.c0), 12 inv_binary (Fq, Fr) and 17 mul_add(a, b, a + b, a * b)
 * (Fq only: Fr rows come out zero).
 */
#include "fp2.cuh"
#include "fr.cuh"
#include "inv_binary.cuh"

template <class T>
DEV_INLINE T ff_apply(int op, const T& a, const T& b) {
    switch (op) {
        case 0: return a * b;
        case 1: return a + b;
        case 2: return a - b;
        case 3: return a.neg();
        case 4: return a.sqr();
        case 5: return a.dbl();
        case 6: return a.inv();
        case 12: return inv_binary(a);
        case 17:
            if constexpr (T::N == 12) return T::mul_add(a, b, a + b, a * b);
            else return T::zero();
        case 7: return a.to_mont();
        case 8: return a.from_mont();
        default: return T::zero();
    }
}

DEV_INLINE fp2_t fp2_apply(int op, const fp2_t& a, const fp2_t& b) {
    switch (op) {
        case 0: return a * b;
        case 1: return a + b;
        case 2: return a - b;
        case 3: return a.neg();
        case 4: return a.sqr();
        case 5: return a.dbl();
        case 6: return a.inv();
        case 10: return a.mul_by_nonresidue();
        case 11: return a.mul_by_fp(b.c0);
        default: return fp2_t::zero();
    }
}

template <class T, int W>
DEV_INLINE void ff_check_row(int op, const uint64_t* a, const uint64_t* b, uint64_t* out, size_t i) {
    T x = T::load(a + W * i), y = T::load(b + W * i);
    if (op == 9) {
        for (int w = 0; w < W; w++) out[W * i + w] = 0;
        out[W * i] = (x == y) ? 1 : 0;
        return;
    }
    ff_apply(op, x, y).store(out + W * i);
}

extern "C" __global__ void __launch_bounds__(256)
ff_check_fq(int op, const uint64_t* a, const uint64_t* b, uint64_t* out, uint64_t n) {
    size_t i = (size_t)blockIdx.x * 256 + threadIdx.x;
    if (i < n) ff_check_row<fp_t, 6>(op, a, b, out, i);
}

extern "C" __global__ void __launch_bounds__(256)
ff_check_fr(int op, const uint64_t* a, const uint64_t* b, uint64_t* out, uint64_t n) {
    size_t i = (size_t)blockIdx.x * 256 + threadIdx.x;
    if (i < n) ff_check_row<fr_t, 4>(op, a, b, out, i);
}

extern "C" __global__ void __launch_bounds__(256)
ff_check_fq2(int op, const uint64_t* a, const uint64_t* b, uint64_t* out, uint64_t n) {
    size_t i = (size_t)blockIdx.x * 256 + threadIdx.x;
    if (i >= n) return;
    fp2_apply(op, fp2_t::load(a + 12 * i), fp2_t::load(b + 12 * i)).store(out + 12 * i);
}
