// 16-byte vector access for the gather kernels: a lane loads kVec consecutive features of one
// row in a single transaction. The planner-side check (vector_width) decides whether a launch
// may use it; kernels get the width as a template argument and never test alignment themselves.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace gnnio {

template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

template <int V, typename T>
__device__ inline Vec<T, V> load_vec(const T* p) {
  return *reinterpret_cast<const Vec<T, V>*>(p);
}

template <int V, typename T>
__device__ inline void store_vec(T* p, const Vec<T, V>& v) {
  *reinterpret_cast<Vec<T, V>*>(p) = v;
}

// Elements per 16-byte vector when every row start is 16-byte aligned (base pointers aligned,
// width and row strides multiples of it), else 1.
template <typename T>
inline int vector_width(int64_t width, std::initializer_list<int64_t> row_strides,
                        std::initializer_list<const void*> bases) {
  constexpr int v = 16 / sizeof(T) > 0 ? 16 / sizeof(T) : 1;
  if (width % v != 0) return 1;
  for (int64_t s : row_strides)
    if (s % v != 0) return 1;
  for (const void* b : bases)
    if (reinterpret_cast<uintptr_t>(b) % 16 != 0) return 1;
  return v;
}

}  // namespace gnnio
