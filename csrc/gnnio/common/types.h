// Element types the kernels understand, named without any framework's types.
#pragma once

#include <cstdint>
#include <utility>

#include "gnnio/common/error.h"

namespace gnnio {

// Index type of a graph: int32 while every node id and edge offset fits, else int64.
enum class IndexType { kInt32, kInt64 };

enum class ScalarType { kFloat32, kFloat64, kFloat16, kBFloat16 };

inline const char* to_string(ScalarType t) {
  switch (t) {
    case ScalarType::kFloat32: return "float32";
    case ScalarType::kFloat64: return "float64";
    case ScalarType::kFloat16: return "float16";
    case ScalarType::kBFloat16: return "bfloat16";
  }
  return "?";
}

// Calls fn with a value of the C++ index type named by t (int32_t{} or int64_t{}).
template <typename Fn>
decltype(auto) dispatch_index(IndexType t, Fn&& fn) {
  if (t == IndexType::kInt32) return std::forward<Fn>(fn)(int32_t{});
  return std::forward<Fn>(fn)(int64_t{});
}

}  // namespace gnnio
