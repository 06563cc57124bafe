/* Force-included before a kernel translation unit to build it as a host shared library.
 *
 * types.cuh already maps __global__/__device__/__host__ to nothing outside nvcc, so an
 * `extern "C" __global__` kernel becomes a plain exported C function. This adds the
 * launch geometry variables and two launchers:
 *   emu_launch       runs every (block, thread) of a 1-D grid in order, each thread to its
 *                    end: a faithful execution for kernels whose threads do not cooperate;
 *   emu_launch_coop  runs the threads of one block as fibers (ucontext) that switch at
 *                    every __syncthreads(): all threads run up to the barrier, then all
 *                    continue, so block-level cooperation through __shared__ memory
 *                    (a static here: blocks run one after another) executes as on the GPU,
 *                    as long as every thread of the block reaches the same barriers (the
 *                    CUDA rule too). Warp intrinsics are not emulated; atomicAdd is a plain
 *                   read-modify-write (threads run one at a time). Lane pairs (threads 2k, 2k + 1)
 *                   exchange words with emu_pair_swap (the device kernels' shuffles over a pair,
 *                   msm/split.cuh): a fiber posts its words and yields until its partner posted
 *                   the matching call, so pairs progress independently of the block's barriers.
 *
 * Calling convention: every kernel parameter is a pointer or an integer of <= 64 bits,
 * so under the x86-64 SysV ABI each occupies one 64-bit register or stack slot and a
 * callee reads the low bits of it; the launchers therefore pass 16 uint64 slots to any
 * kernel (extra trailing arguments are ignored by the callee).
 */
#pragma once
#include <cstdint>
#include <cstdlib>
#include <ucontext.h>
#include <vector>

struct emu_dim3 {
    unsigned x, y, z;
};
static emu_dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __launch_bounds__(...)
#define __shared__ static

/* Atomics: the emulated threads run one at a time, so a read-modify-write is atomic. */
static inline unsigned atomicAdd(unsigned* p, unsigned v) {
    unsigned old = *p;
    *p = old + v;
    return old;
}

/* The vector type and intrinsics of ntt/fr_io.cuh (16-byte Fr halves, read-only loads, bit reversal). */
struct uint4 {
    unsigned x, y, z, w;
};
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
template <class T>
static inline T __ldg(const T* p) {
    return *p;
}
static inline unsigned __brev(unsigned x) {
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}

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

/* ------------------------------------------------------------ block-cooperative launches */
#define EMU_PAIR_WORDS 64
struct emu_fiber {
    ucontext_t ctx;
    unsigned tid;
    bool done;
    bool at_barrier;                           /* waiting in __syncthreads (else running or in a pair swap) */
    uint64_t posted;                           /* emu_pair_swap calls made so far */
    uint32_t box[2][EMU_PAIR_WORDS];           /* the words of call k in box[k & 1] */
};
static ucontext_t emu_sched;
static emu_fiber* emu_cur = nullptr;
static emu_fiber* emu_fibers = nullptr;
static unsigned emu_block = 0;
static uint64_t emu_progress = 0; /* pair swaps posted and completed: fibers that wait on each other move */
static emu_kernel_fn emu_fn;
static const uint64_t* emu_args;

/* A barrier: back to the scheduler, which resumes this fiber once every thread got here. */
static void __syncthreads() {
    if (!emu_cur) abort(); /* a barrier in a kernel launched with emu_launch */
    emu_cur->at_barrier = true;
    swapcontext(&emu_cur->ctx, &emu_sched);
}

/* Swaps w[0 .. n) with the partner lane's (threadIdx.x ^ 1) matching call. The partner is at most
 * one call ahead (it waits for this fiber's next post), so two boxes per fiber suffice. */
extern "C" void emu_pair_swap(uint32_t* w, unsigned n) {
    if (!emu_cur || n > EMU_PAIR_WORDS || (emu_cur->tid ^ 1u) >= emu_block) abort();
    emu_fiber* me = emu_cur;
    emu_fiber* other = &emu_fibers[me->tid ^ 1u];
    const uint64_t k = me->posted;
    for (unsigned i = 0; i < n; i++) me->box[k & 1][i] = w[i];
    me->posted = k + 1;
    emu_progress++;
    while (other->posted <= k) {
        if (other->done || other->at_barrier) abort(); /* the partner will never make this call */
        swapcontext(&me->ctx, &emu_sched);
    }
    for (unsigned i = 0; i < n; i++) w[i] = other->box[k & 1][i];
    emu_progress++;
}

static void emu_fiber_main() {
    const uint64_t* a = emu_args;
    emu_fn(a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7], a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15]);
    emu_cur->done = true;
}

extern "C" void emu_launch_coop(void* fn, unsigned grid, unsigned block, const uint64_t* a) {
    const size_t STACK = 256 << 10;
    emu_fn = (emu_kernel_fn)fn;
    emu_args = a;
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    std::vector<emu_fiber> fibers(block);
    emu_fibers = fibers.data();
    emu_block = block;
    char* stacks = (char*)malloc((size_t)block * STACK); /* uninitialised: no 32 MB memset per launch */
    if (!stacks) abort();
    for (unsigned b = 0; b < grid; b++) {
        blockIdx = {b, 0, 0};
        for (unsigned t = 0; t < block; t++) {
            emu_fiber& f = fibers[t];
            f.tid = t;
            f.done = false;
            f.at_barrier = false;
            f.posted = 0;
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = stacks + (size_t)t * STACK;
            f.ctx.uc_stack.ss_size = STACK;
            f.ctx.uc_link = &emu_sched;
            makecontext(&f.ctx, emu_fiber_main, 0);
        }
        /* One phase = every live thread runs to its next barrier or its end; a thread waiting in a
         * pair swap is resumed by the next sweep of the same phase. */
        for (;;) {
            unsigned ended = 0;
            for (;;) { /* sweeps until no live thread is outside a barrier */
                unsigned waiting = 0, stopped = 0;
                const uint64_t progress = emu_progress;
                for (unsigned t = 0; t < block; t++) {
                    emu_fiber& f = fibers[t];
                    if (f.done || f.at_barrier) continue;
                    emu_cur = &f;
                    threadIdx = {t, 0, 0};
                    swapcontext(&emu_sched, &f.ctx);
                    ended += f.done;
                    stopped += f.done || f.at_barrier;
                    waiting += !f.done && !f.at_barrier;
                }
                if (!waiting) break;
                if (!stopped && emu_progress == progress) abort(); /* pairs waiting on each other forever */
            }
            unsigned live = 0;
            for (unsigned t = 0; t < block; t++) live += !fibers[t].done;
            /* threads that end while others wait at a barrier: a divergent barrier (UB in CUDA) */
            if (ended && live) abort();
            if (!live) break;
            for (unsigned t = 0; t < block; t++) fibers[t].at_barrier = false;
        }
    }
    emu_cur = nullptr;
    emu_fibers = nullptr;
    free(stacks);
}
