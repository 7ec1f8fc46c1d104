// Validation for the graph-format ops, shared by the CPU and CUDA bindings.
#pragma once

#include "common.h"
#include "gnnio/graph/csr.h"

namespace gnnio::binding {

// Ids checked on the host side of one reduction, so a bad edge_index raises IndexError instead
// of a device assert that would poison the CUDA context (the CPU builds check as they go).
inline void check_id_range(const at::Tensor& ids, int64_t bound, const char* what) {
  if (ids.numel() == 0) return;
  const auto [lo, hi] = at::aminmax(ids);
  const int64_t min_id = lo.item<int64_t>(), max_id = hi.item<int64_t>();
  TORCH_CHECK_INDEX(min_id >= 0 && max_id < bound, text(what, " ids must lie in [0, ", bound,
                                                        "), found values in [", min_id, ", ",
                                                        max_id, "]"));
}

struct CsrBuildTensors {
  at::Tensor row, col, rowptr, col_sorted, perm;
  CsrBuildParams params;
};

inline CsrBuildTensors prepare_csr_build(const at::Tensor& row, const at::Tensor& col,
                                         int64_t num_rows, int64_t num_cols) {
  const IndexType index_type = index_type_of(row, "row");
  TORCH_CHECK_VALUE(row.scalar_type() == col.scalar_type(), "row and col must share a dtype");
  TORCH_CHECK_VALUE(row.dim() == 1 && col.dim() == 1 && row.numel() == col.numel(),
                    "row and col must be 1-D of equal length");
  TORCH_CHECK_VALUE(num_rows >= 0 && num_cols >= 0, "num_rows and num_cols must be >= 0");
  check_same_device(row, "row", col, "col");
  CsrBuildTensors t;
  t.row = row.contiguous();
  t.col = col.contiguous();
  t.rowptr = at::empty({num_rows + 1}, t.row.options());
  t.col_sorted = at::empty({t.row.numel()}, t.row.options());
  t.perm = at::empty({t.row.numel()}, t.row.options());
  CsrBuildParams& p = t.params;
  p.row = t.row.data_ptr();
  p.col = t.col.data_ptr();
  p.num_edges = t.row.numel();
  p.num_rows = num_rows;
  p.num_cols = num_cols;
  p.index_type = index_type;
  p.rowptr = t.rowptr.data_ptr();
  p.col_sorted = t.col_sorted.data_ptr();
  p.perm = t.perm.data_ptr();
  return t;
}

}  // namespace gnnio::binding
