// Shared helpers of the binding: framework types -> core types, and core errors -> the Python
// exceptions PyG users expect. Kernels never see anything from this file.
#pragma once

#include <cstdlib>

#include <torch/library.h>
#include <ATen/ATen.h>

#include "gnnio/common/error.h"
#include "gnnio/common/row_split.h"
#include "gnnio/common/types.h"

namespace gnnio::binding {

// Text for error messages (see gnnio::text): framework values converted without iostreams.
inline std::string sizes_text(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}
inline const char* dtype_text(at::ScalarType t) { return c10::toString(t); }

// Whether the environment variable `name` is set to a value starting with '0' (a measurement
// knob that turns a default path off).
inline bool env_flag_off(const char* name) {
  const char* v = std::getenv(name);
  return v && v[0] == '0';
}
inline std::string device_text(const at::Device& d) { return d.str(); }

inline ScalarType scalar_type_of(const at::Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case at::kFloat: return ScalarType::kFloat32;
    case at::kDouble: return ScalarType::kFloat64;
    case at::kHalf: return ScalarType::kFloat16;
    case at::kBFloat16: return ScalarType::kBFloat16;
    default:
      TORCH_CHECK_TYPE(false, text(name, " must be a floating-point tensor (float32, float64, ",
                                   "float16 or bfloat16), got ", dtype_text(t.scalar_type())));
  }
}

inline IndexType index_type_of(const at::Tensor& t, const char* name) {
  TORCH_CHECK_VALUE(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong,
                    text(name, " must be an int32 or int64 tensor, got ", dtype_text(t.scalar_type())));
  return t.scalar_type() == at::kInt ? IndexType::kInt32 : IndexType::kInt64;
}

inline void check_same_device(const at::Tensor& a, const char* a_name, const at::Tensor& b,
                              const char* b_name) {
  TORCH_CHECK_VALUE(a.device() == b.device(), text(a_name, " is on ", device_text(a.device()),
                                                   " but ", b_name, " is on ", device_text(b.device())));
}

// The planner's light/heavy split of one CSR (gnnio.plan): heavy row ids int64 [H] and work
// items int64 [I, 3] on the device of `like`; an empty split when absent. Shared by the
// reduction and attention bindings.
inline RowSplit row_split_of(const c10::optional<at::Tensor>& heavy,
                             const c10::optional<at::Tensor>& items, int64_t light_max,
                             const at::Tensor& like, const char* what) {
  RowSplit split;
  if (!heavy.has_value() || !items.has_value() || heavy->numel() == 0) return split;
  TORCH_CHECK_VALUE(heavy->scalar_type() == at::kLong && items->scalar_type() == at::kLong &&
                        heavy->dim() == 1 && items->dim() == 2 && items->size(1) == 3 &&
                        heavy->is_contiguous() && items->is_contiguous(),
                    text(what, ": heavy rows must be int64 [H] and items int64 [I, 3]"));
  check_same_device(*heavy, "heavy rows", like, what);
  check_same_device(*items, "heavy items", like, what);
  split.heavy_rows = heavy->data_ptr<int64_t>();
  split.heavy_items = items->data_ptr<int64_t>();
  split.num_heavy = heavy->numel();
  split.num_items = items->size(0);
  split.light_max_degree = light_max;
  return split;
}

// Runs fn, translating gnnio::Error into IndexError / ValueError / TypeError / RuntimeError.
template <typename Fn>
decltype(auto) translate_errors(Fn&& fn) {
  try {
    return fn();
  } catch (const Error& e) {
    switch (e.kind()) {
      case ErrorKind::kIndex: TORCH_CHECK_INDEX(false, e.what());
      case ErrorKind::kInvalidArgument: TORCH_CHECK_VALUE(false, e.what());
      case ErrorKind::kType: TORCH_CHECK_TYPE(false, e.what());
      default: TORCH_CHECK(false, e.what());
    }
  }
}

}  // namespace gnnio::binding
