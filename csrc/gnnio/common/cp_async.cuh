// cp.async (sm_80+): 16 bytes global -> shared without a register round trip, so a warp's next
// loads are in flight while it computes. Shared by the WSB kernels (wsb/cuda.cu, the SpMM's
// double buffer; wsb/attention_cuda.cu, the attention's value and dout rows) and the fused
// TransformerConv kernel's staged column indices (transformer/cuda.cu, cp_async_small).
#pragma once

#include <type_traits>

namespace gnnio {

// src_bytes 0 writes zeros (rows past the matrix, features past the width); gmem is not read then.
__device__ inline void cp_async16(void* smem, const void* gmem, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem),
               "r"(valid ? 16 : 0));
#endif
}
// 4 or 8 bytes (an index) global -> shared, through L1 (.ca: the 16-byte .cg form takes 16 only).
// Before sm_80 a plain copy, which the wait functions then need not wait for.
template <int kBytes>
__device__ inline void cp_async_small(void* smem, const void* gmem) {
  static_assert(kBytes == 4 || kBytes == 8, "cp.async.ca copies 4, 8 or 16 bytes");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(s), "l"(gmem), "n"(kBytes));
#else
  using word = std::conditional_t<kBytes == 4, unsigned, unsigned long long>;
  *static_cast<word*>(smem) = *static_cast<const word*>(gmem);
#endif
}
__device__ inline void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
__device__ inline void cp_async_wait_all_but_newest() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group 1;\n" ::);
#endif
}
// Every copy this thread issued has landed (visible to the thread; a __syncwarp or
// __syncthreads after it makes them visible to the others).
__device__ inline void cp_async_wait_all() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

}  // namespace gnnio
