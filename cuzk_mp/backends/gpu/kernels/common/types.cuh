/* Fixed-width integer types and the inline qualifiers every kernel header uses.
 *
 * NVRTC has no standard headers, so under __CUDACC_RTC__ the <cstdint> names are
 * typedefs; a host C++ build (the CPU unit test of the field arithmetic) and nvcc
 * take them from <cstdint>. FF_INLINE marks arithmetic that compiles for both the
 * device and the host (the host path is a portable fallback of the PTX carry
 * chains, used to test the formulas on a machine with no GPU).
 */
#pragma once

#ifdef __CUDACC_RTC__
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef int int32_t;
typedef long long int64_t;
/* size_t is predefined by NVRTC (its own headers declare malloc(size_t)). */
#else
#include <cstdint>
#include <cstddef>
#endif

#ifdef __CUDACC__
#define FF_INLINE __host__ __device__ __forceinline__
#define DEV_INLINE __device__ __forceinline__
#else
#define FF_INLINE inline
#define DEV_INLINE inline
#define __host__
#define __device__
#define __global__
#endif
