// Two floats rounded to a 16-bit type (to nearest even) and packed into one
// 32-bit word, the lower index in the lower half: the layout of a bf16x2 or
// half2 register, of an mma operand pair, and of two consecutive 16-bit
// elements in memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace meshlm::cuda {

template <typename T>
__device__ __forceinline__ uint32_t pack_16bit(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack_16bit<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack_16bit<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);  // beyond 65504 (after rounding): infinity
  return *reinterpret_cast<const uint32_t*>(&v);
}

}  // namespace meshlm::cuda
