/* Force-included before a kernel translation unit to build it as a host shared library.
 *
 * types.cuh already maps __global__/__device__/__host__ to nothing outside nvcc, so an
 * `extern "C" __global__` kernel becomes a plain exported C function. This adds the
 * launch geometry variables and emu_launch, which runs every (block, thread) of a 1-D
 * grid in order. That is a faithful execution only for kernels whose threads do not
 * cooperate (no shared memory, barriers, warp intrinsics or atomics), which is the
 * contract of msm.cu and fixed_base.cu.
 *
 * Calling convention: every kernel parameter is a pointer or an integer of <= 64 bits,
 * so under the x86-64 SysV ABI each occupies one 64-bit register or stack slot and a
 * callee reads the low bits of it; emu_launch therefore passes 16 uint64 slots to any
 * kernel (extra trailing arguments are ignored by the callee).
 */
#pragma once
#include <cstdint>

struct emu_dim3 {
    unsigned x, y, z;
};
static emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __launch_bounds__(...)

#define EMU_SLOTS 16
typedef void (*emu_kernel_fn)(uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t,
                              uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t);

extern "C" void emu_launch(void* fn, unsigned grid, unsigned block, const uint64_t* a) {
    emu_kernel_fn f = (emu_kernel_fn)fn;
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    for (unsigned b = 0; b < grid; b++) {
        for (unsigned t = 0; t < block; t++) {
            blockIdx = {b, 0, 0};
            threadIdx = {t, 0, 0};
            f(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15]);
        }
    }
}
