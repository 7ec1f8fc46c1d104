// Element conversions for CUDA kernels that accumulate half types in float32 (and float64 in
// float64). Explicit intrinsics: torch builds with __CUDA_NO_HALF_CONVERSIONS__.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "gnnio/common/types.h"

namespace gnnio {

// The accumulator type of an element type.
template <typename T>
using acc_type_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

__device__ inline float to_acc(float v) { return v; }
__device__ inline double to_acc(double v) { return v; }
__device__ inline float to_acc(__half v) { return __half2float(v); }
__device__ inline float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }

// a * b + c rounded once, whatever nvcc / ptxas would contract: for sums that two kernels claim
// to compute with the same bits (attention's dot scores, its accumulation, and row_score against
// head_scores' piece kernel).
__device__ inline float fma_pinned(float a, float b, float c) { return __fmaf_rn(a, b, c); }
__device__ inline double fma_pinned(double a, double b, double c) { return __fma_rn(a, b, c); }
// a * b rounded on its own: never contracted into a following add.
__device__ inline float mul_pinned(float a, float b) { return __fmul_rn(a, b); }
__device__ inline double mul_pinned(double a, double b) { return __dmul_rn(a, b); }

template <typename T, typename A>
__device__ inline T from_acc(A v) {
  if constexpr (std::is_same_v<T, double>) return static_cast<double>(v);
  else if constexpr (std::is_same_v<T, float>) return static_cast<float>(v);
  else if constexpr (std::is_same_v<T, __half>) return __float2half(static_cast<float>(v));
  else return __float2bfloat16(static_cast<float>(v));
}

// Calls fn(scalar_t{}, index_t{}) with the CUDA kernels' element types: float, double, __half,
// __nv_bfloat16.
template <typename Fn>
void dispatch_cuda(ScalarType scalar, IndexType index, Fn&& fn) {
  dispatch_index(index, [&](auto index_tag) {
    switch (scalar) {
      case ScalarType::kFloat32: return fn(float{}, index_tag);
      case ScalarType::kFloat64: return fn(double{}, index_tag);
      case ScalarType::kFloat16: return fn(__half{}, index_tag);
      case ScalarType::kBFloat16: return fn(__nv_bfloat16{}, index_tag);
    }
  });
}

}  // namespace gnnio
