/* Test kernel of ec/ (tests/test_gpu_msm.py): the Fq2 products the G2 MSM variants use.
 *
 * ec_fp2_mul_check: thread t < n multiplies a[t] by b[t] (fp2_t, 12 uint64 each,
 * Montgomery form) with fp2_lazy::mul into out[2 t] and with fp2_t::operator* into
 * out[2 t + 1]. No shared memory, no cooperation (runs in the CPU emulator too).
 */
#include "../ff/fp2_lazy.cuh"

extern "C" __global__ void ec_fp2_mul_check(const uint64_t* a, const uint64_t* b, uint64_t* out, uint64_t n) {
    uint64_t t = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n) return;
    fp2_t x = fp2_t::load(a + 12 * t), y = fp2_t::load(b + 12 * t);
    fp2_lazy::mul(x, y).store(out + 24 * t);
    (x * y).store(out + 24 * t + 12);
}
