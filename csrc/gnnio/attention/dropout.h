// Dropout on attention weights with a counter-based generator: whether weight (slot k, head h)
// is kept is a pure function of (seed, k, h), so the forward and backward passes (and the CPU
// and CUDA kernels) agree without storing a mask. splitmix64's finalizer as the mixing function.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define GNNIO_HOST_DEVICE __host__ __device__
#else
#define GNNIO_HOST_DEVICE
#endif

namespace gnnio {

GNNIO_HOST_DEVICE inline uint64_t mix64(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// True when the weight survives: a 24-bit uniform draw u in [0, 1) with u >= dropout.
GNNIO_HOST_DEVICE inline bool dropout_keep(uint64_t seed, int64_t slot, int64_t head, int64_t heads,
                                           double dropout) {
  const uint64_t counter = static_cast<uint64_t>(slot) * static_cast<uint64_t>(heads) +
                           static_cast<uint64_t>(head);
  const uint64_t bits = mix64(counter ^ mix64(seed));
  return static_cast<double>(bits >> 40) * (1.0 / 16777216.0) >= dropout;
}

// dropout_keep's test with its per-call parts precomputed: (bits >> 40) * 2^-24 >= dropout holds
// exactly when the integer bits >> 40 reaches ceil(dropout * 2^24) (the scaling is exact).
struct DropoutTest {
  uint64_t seed_mix;
  uint32_t threshold;
};

inline DropoutTest dropout_test(uint64_t seed, double dropout) {
  const double t = dropout * 16777216.0;
  uint32_t threshold = static_cast<uint32_t>(t);
  if (static_cast<double>(threshold) < t) ++threshold;
  return {mix64(seed), threshold};
}

GNNIO_HOST_DEVICE inline bool dropout_keep_fast(uint64_t seed_mix, uint32_t threshold, int64_t slot,
                                                int64_t head, int64_t heads) {
  const uint64_t counter = static_cast<uint64_t>(slot) * static_cast<uint64_t>(heads) +
                           static_cast<uint64_t>(head);
  return static_cast<uint32_t>(mix64(counter ^ seed_mix) >> 40) >= threshold;
}

}  // namespace gnnio
