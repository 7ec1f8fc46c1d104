// What every CPU kernel family shares: the element types it is instantiated for, and when an
// OpenMP team is worth waking.
#pragma once

#include <cstdint>
#include <utility>

#include "gnnio/common/error.h"
#include "gnnio/common/types.h"

namespace gnnio {

// Below ~64K element visits, waking the OpenMP team costs more than the work (a 300-edge
// SpMM went from 686 us to 14 us per call on a 2-core machine with this cut).
inline bool worth_threads(int64_t work) { return work > (int64_t(1) << 16); }

// Calls fn(scalar_t{}, index_t{}) with scalar_t in {float, double}; any other element type is
// a kType error naming `what` (TypeError in Python, as PyG_CONTRACTS' checklist asks).
template <typename Fn>
void dispatch_cpu(ScalarType scalar, IndexType index, const char* what, Fn&& fn) {
  dispatch_index(index, [&](auto index_tag) {
    switch (scalar) {
      case ScalarType::kFloat32: return fn(float{}, index_tag);
      case ScalarType::kFloat64: return fn(double{}, index_tag);
      default:
        detail::fail(ErrorKind::kType, what, " on CPU supports float32 and float64, got ",
                     to_string(scalar));
    }
  });
}

}  // namespace gnnio
