// Validation and params filling for the WSB family, shared by the CPU and CUDA bindings.
#pragma once

#include "common.h"
#include "gnnio/wsb/params.h"

namespace gnnio::binding {

// The operands of wsb_from_coo, checked. Ids are range-checked by each device's build.
inline IndexType check_wsb_build(const at::Tensor& row, const at::Tensor& col, int64_t num_rows,
                                 int64_t num_cols) {
  const IndexType index_type = index_type_of(row, "row");
  TORCH_CHECK_VALUE(row.scalar_type() == col.scalar_type(), "wsb_from_coo: row and col must share a dtype");
  TORCH_CHECK_VALUE(row.dim() == 1 && col.dim() == 1 && row.numel() == col.numel(),
                    "wsb_from_coo: row and col must be 1-D of equal length");
  TORCH_CHECK_VALUE(num_rows >= 0 && num_cols >= 0, "wsb_from_coo: num_rows and num_cols must be >= 0");
  check_same_device(row, "row", col, "col");
  return index_type;
}

inline void check_wsb(const at::Tensor& block_rowptr, const at::Tensor& block_col, int64_t num_rows,
                      const char* which) {
  index_type_of(block_rowptr, "block_rowptr");
  TORCH_CHECK_VALUE(block_rowptr.scalar_type() == block_col.scalar_type(),
                    text(which, ": block_rowptr and block_col must share a dtype"));
  TORCH_CHECK_VALUE(num_rows >= 0, text(which, ": num_rows must be >= 0"));
  TORCH_CHECK_VALUE(block_rowptr.dim() == 1 && block_rowptr.numel() == wsb_blocks(num_rows) + 1,
                    text(which, ": block_rowptr must have ceil(num_rows / 16) + 1 = ",
                         wsb_blocks(num_rows) + 1, " entries, got ", sizes_text(block_rowptr.sizes())));
  TORCH_CHECK_VALUE(block_col.dim() == 1, text(which, ": block_col must be 1-D"));
  TORCH_CHECK_VALUE(block_rowptr.is_contiguous() && block_col.is_contiguous(),
                    text(which, ": block_rowptr and block_col must be contiguous"));
}

// Checks the forward operands and fills WsbSpmmParams for out = A · x. `out` must be allocated
// [num_rows, x.size(1)] contiguous. Like the CSR ops, the structure itself (monotone
// block_rowptr, block columns in range) is trusted: gnnio.Graph builds it from a checked
// edge_index.
inline WsbSpmmParams wsb_spmm_params(const at::Tensor& block_rowptr, const at::Tensor& block_col,
                                     const at::Tensor& values, const at::Tensor& x,
                                     int64_t num_rows, int64_t num_cols, const at::Tensor& out) {
  check_wsb(block_rowptr, block_col, num_rows, "wsb_spmm");
  TORCH_CHECK_VALUE(x.dim() == 2, text("wsb_spmm: x must be 2-D [num_cols, features], got ",
                                       sizes_text(x.sizes())));
  TORCH_CHECK_VALUE(x.size(0) == num_cols, text("wsb_spmm: x has ", x.size(0),
                                                " rows but the matrix has ", num_cols, " columns"));
  TORCH_CHECK_VALUE(x.stride(1) == 1 || x.size(1) <= 1 || x.numel() == 0,  // an empty grad may be an expanded view
                    "wsb_spmm: x must have unit feature stride");
  const int64_t tiles = block_col.numel();
  TORCH_CHECK_VALUE(values.sizes() == at::IntArrayRef({tiles, kWsbTile, kWsbTile}) && values.is_contiguous(),
                    text("wsb_spmm: values must be contiguous [num_tiles = ", tiles, ", 16, 16], got ",
                         sizes_text(values.sizes())));
  TORCH_CHECK_TYPE(values.scalar_type() == x.scalar_type(),
                   text("wsb_spmm: values has dtype ", dtype_text(values.scalar_type()), " but x has ",
                        dtype_text(x.scalar_type())));
  check_same_device(block_rowptr, "block_rowptr", x, "x");
  check_same_device(block_col, "block_col", x, "x");
  check_same_device(values, "values", x, "x");
  WsbSpmmParams p;
  p.block_rowptr = block_rowptr.data_ptr();
  p.block_col = block_col.data_ptr();
  p.index_type = index_type_of(block_rowptr, "block_rowptr");
  p.values = values.data_ptr();
  p.x = x.data_ptr();
  p.out = out.data_ptr();
  p.scalar_type = scalar_type_of(x, "x");
  p.num_rows = num_rows;
  p.num_cols = num_cols;
  p.num_tiles = tiles;
  p.width = x.size(1);
  p.x_row_stride = x.stride(0);
  p.out_row_stride = out.size(1);
  return p;
}

// out [num_tiles, 16, 16] = the gradient of the tile values, for a = the output gradient
// [num_rows, F] and b = the features [num_cols, F] (both contiguous).
inline WsbSddmmParams wsb_sddmm_params(const at::Tensor& block_rowptr, const at::Tensor& block_col,
                                       const at::Tensor& a, const at::Tensor& b,
                                       const at::Tensor& out) {
  TORCH_CHECK_VALUE(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(1),
                    text("wsb_sddmm: a and b must be 2-D with equal widths, got ", sizes_text(a.sizes()),
                         " and ", sizes_text(b.sizes())));
  check_wsb(block_rowptr, block_col, a.size(0), "wsb_sddmm");
  TORCH_CHECK_TYPE(a.scalar_type() == b.scalar_type(), "wsb_sddmm: a and b must share a dtype");
  TORCH_CHECK_VALUE(a.is_contiguous() && b.is_contiguous(), "wsb_sddmm: a and b must be contiguous");
  check_same_device(a, "a", b, "b");
  check_same_device(block_rowptr, "block_rowptr", a, "a");
  check_same_device(block_col, "block_col", a, "a");
  WsbSddmmParams p;
  p.block_rowptr = block_rowptr.data_ptr();
  p.block_col = block_col.data_ptr();
  p.index_type = index_type_of(block_rowptr, "block_rowptr");
  p.a = a.data_ptr();
  p.b = b.data_ptr();
  p.out = out.data_ptr();
  p.scalar_type = scalar_type_of(a, "a");
  p.num_rows = a.size(0);
  p.num_cols = b.size(0);
  p.num_tiles = block_col.numel();
  p.width = a.size(1);
  p.a_row_stride = a.size(1);
  p.b_row_stride = b.size(1);
  return p;
}

}  // namespace gnnio::binding
