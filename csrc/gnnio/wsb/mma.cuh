// What the WSB kernels share about the tensor-core MMA (nvcuda::wmma): each element type's
// operand precision and k step, and the float32 -> tf32 rounding of an operand fragment.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <type_traits>

namespace gnnio {

// tf32 fragments take k = 8 (two steps per 16-wide tile), 16-bit ones k = 16. Accumulation is
// float32 for all three.
template <typename T>
struct MmaTraits;
template <>
struct MmaTraits<float> {
  using operand = nvcuda::wmma::precision::tf32;
  static constexpr int kK = 8;
};
template <>
struct MmaTraits<__half> {
  using operand = __half;
  static constexpr int kK = 16;
};
template <>
struct MmaTraits<__nv_bfloat16> {
  using operand = __nv_bfloat16;
  static constexpr int kK = 16;
};

// A float32 operand fragment is loaded as float32 and rounded to tf32 here; 16-bit ones are
// used as loaded.
template <typename T, typename Fragment>
__device__ inline void to_operand(Fragment& frag) {
  if constexpr (std::is_same_v<T, float>) {
    for (int i = 0; i < frag.num_elements; ++i) frag.x[i] = nvcuda::wmma::__float_to_tf32(frag.x[i]);
  }
}

}  // namespace gnnio
