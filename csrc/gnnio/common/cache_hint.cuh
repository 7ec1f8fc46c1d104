// Loads with an L2 eviction priority. A gather kernel streams gigabytes of feature rows through
// the 50 MB L2, which evicts the small per-node arrays that every slot also reads at random:
// GAT's source scores (16 MB on powerlaw-1M-16M) missed L2 on 95% of their loads (ncu, NOTES
// v14), each a random 32-byte DRAM access beside the row's own 512-byte one. Marked evict_last,
// they are the last lines the L2 gives up. A hint only: the value loaded is the same.
#pragma once

#include <cstdint>
#include <cstring>

namespace gnnio {

__device__ inline uint64_t l2_evict_last_policy() {
  uint64_t policy;
  asm("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// *ptr, read through L2 with evict_last priority (4- and 2-byte types, GAT's scores in float32
// or 16 bits; others read plainly).
template <typename T>
__device__ inline T load_evict_last(const T* ptr) {
  if constexpr (sizeof(T) == 4) {
    uint32_t bits;
    asm("ld.global.L2::cache_hint.b32 %0, [%1], %2;"
        : "=r"(bits) : "l"(ptr), "l"(l2_evict_last_policy()));
    T v;
    memcpy(&v, &bits, sizeof(T));
    return v;
  } else if constexpr (sizeof(T) == 2) {
    uint16_t bits;
    asm("ld.global.L2::cache_hint.b16 %0, [%1], %2;"
        : "=h"(bits) : "l"(ptr), "l"(l2_evict_last_policy()));
    T v;
    memcpy(&v, &bits, sizeof(T));
    return v;
  } else {
    return *ptr;
  }
}

}  // namespace gnnio
