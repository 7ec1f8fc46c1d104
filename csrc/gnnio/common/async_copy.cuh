// cp.async (sm_80 and later): a global -> shared copy that holds no register while it is in
// flight, so a lane can keep its next rows in flight while it computes on the ones it has.
// Each lane reads back only what it copied itself, so waiting for its own groups suffices (no
// barrier). Before sm_80 the copy is a plain load and store.
#pragma once

namespace gnnio {

// 16 bytes from gmem to smem, both 16-byte aligned.
__device__ inline void cp_async_16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(gmem) : "memory");
#else
  *static_cast<uint4*>(smem) = *static_cast<const uint4*>(gmem);
#endif
}

// Closes this lane's group of copies issued since the last commit.
__device__ inline void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most kPending of this lane's committed groups are still in flight.
template <int kPending>
__device__ inline void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

}  // namespace gnnio
