// Validation and params filling for the SpMM family, shared by the CPU and CUDA bindings so the
// prologue is written once.
#pragma once

#include "common.h"
#include "gnnio/spmm/params.h"

namespace gnnio::binding {

inline void check_csr(const at::Tensor& rowptr, const at::Tensor& col, int64_t num_rows,
                      const char* which) {
  TORCH_CHECK_VALUE(num_rows >= 0, text(which, ": num_rows must be >= 0, got ", num_rows));
  index_type_of(rowptr, "rowptr");
  TORCH_CHECK_VALUE(rowptr.scalar_type() == col.scalar_type(),
                    text(which, ": rowptr and col must share a dtype"));
  TORCH_CHECK_VALUE(rowptr.dim() == 1 && rowptr.numel() == num_rows + 1,
                    text(which, ": rowptr must have num_rows + 1 = ", num_rows + 1,
                         " entries, got ", sizes_text(rowptr.sizes())));
  TORCH_CHECK_VALUE(col.dim() == 1, text(which, ": col must be 1-D"));
  TORCH_CHECK_VALUE(rowptr.is_contiguous() && col.is_contiguous(),
                    text(which, ": rowptr and col must be contiguous"));
}

// Checks the forward operands and fills SpmmParams for out = A · x. `out` must be allocated.
inline SpmmParams spmm_params(const at::Tensor& rowptr, const at::Tensor& col,
                              const c10::optional<at::Tensor>& value, const at::Tensor& x,
                              int64_t num_rows, int64_t num_cols, const at::Tensor& out) {
  check_csr(rowptr, col, num_rows, "spmm");
  TORCH_CHECK_VALUE(x.dim() == 2,
                    text("spmm: x must be 2-D [num_src, features], got ", sizes_text(x.sizes())));
  TORCH_CHECK_VALUE(x.size(0) == num_cols, text("spmm: x has ", x.size(0),
                                                " rows but the graph has ", num_cols, " source nodes"));
  TORCH_CHECK_VALUE(x.stride(1) == 1 || x.size(1) <= 1 || x.numel() == 0,
                    "spmm: x must have unit feature stride");
  check_same_device(rowptr, "rowptr", x, "x");
  check_same_device(col, "col", x, "x");
  SpmmParams p;
  p.rowptr = rowptr.data_ptr();
  p.col = col.data_ptr();
  p.index_type = index_type_of(rowptr, "rowptr");
  p.scalar_type = scalar_type_of(x, "x");
  if (value.has_value()) {
    TORCH_CHECK_VALUE(value->dim() == 1 && value->numel() == col.numel(),
                      text("spmm: value must be 1-D with one entry per edge (", col.numel(),
                           "), got ", sizes_text(value->sizes())));
    TORCH_CHECK_TYPE(value->scalar_type() == x.scalar_type(),
                     text("spmm: value has dtype ", dtype_text(value->scalar_type()), " but x has ",
                          dtype_text(x.scalar_type())));
    TORCH_CHECK_VALUE(value->is_contiguous(), "spmm: value must be contiguous");
    check_same_device(*value, "value", x, "x");
    p.value = value->data_ptr();
  }
  p.x = x.data_ptr();
  p.out = out.data_ptr();
  p.num_rows = num_rows;
  p.num_cols = num_cols;
  p.nnz = col.numel();
  p.width = x.size(1);
  p.x_row_stride = x.stride(0);  // also for width 1: a column slice keeps its row stride
  p.out_row_stride = out.size(1);
  return p;
}

inline SddmmParams sddmm_params(const at::Tensor& rowptr, const at::Tensor& col,
                                const at::Tensor& a, const at::Tensor& b, const at::Tensor& out) {
  check_csr(rowptr, col, a.size(0), "sddmm");
  TORCH_CHECK_VALUE(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(1),
                    text("sddmm: a and b must be 2-D with equal widths, got ", sizes_text(a.sizes()),
                         " and ", sizes_text(b.sizes())));
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), "sddmm: a and b must share a dtype");
  TORCH_CHECK_VALUE(a.is_contiguous() && b.is_contiguous(), "sddmm: a and b must be contiguous");
  check_same_device(a, "a", b, "b");
  check_same_device(rowptr, "rowptr", a, "a");
  check_same_device(col, "col", a, "a");
  SddmmParams p;
  p.rowptr = rowptr.data_ptr();
  p.col = col.data_ptr();
  p.index_type = index_type_of(rowptr, "rowptr");
  p.a = a.data_ptr();
  p.b = b.data_ptr();
  p.out = out.data_ptr();
  p.scalar_type = scalar_type_of(a, "a");
  p.num_rows = a.size(0);
  p.nnz = col.numel();
  p.width = a.size(1);
  p.a_row_stride = a.size(1);
  p.b_row_stride = b.size(1);
  return p;
}

}  // namespace gnnio::binding
