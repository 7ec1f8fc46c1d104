// Validation and params filling for the reduction family, shared by the CPU and CUDA bindings.
#pragma once

#include "common.h"
#include "gnnio/reduce/params.h"
#include "spmm_common.h"

namespace gnnio::binding {

inline ReduceOp reduce_op_of(c10::string_view reduce) {
  if (reduce == "max" || reduce == "amax") return ReduceOp::kMax;
  if (reduce == "min" || reduce == "amin") return ReduceOp::kMin;
  TORCH_CHECK_VALUE(false, text("segment_reduce: reduce must be 'max' or 'min', got '",
                                std::string(reduce), "'"));
}

// A slot weight: [nnz] contiguous, x's dtype and device (the Python side casts edge weights to
// the features' dtype and puts them in slot order, as for SpMM).
inline const void* slot_weight_of(const c10::optional<at::Tensor>& weight, const at::Tensor& col,
                                  const at::Tensor& like, const char* what) {
  if (!weight.has_value()) return nullptr;
  const at::Tensor& w = *weight;
  TORCH_CHECK_VALUE(w.dim() == 1 && w.numel() == col.numel() && w.is_contiguous(),
                    text(what, ": weight must be a contiguous [nnz] = [", col.numel(), "] tensor, got ",
                         sizes_text(w.sizes())));
  TORCH_CHECK_VALUE(w.scalar_type() == like.scalar_type(),
                    text(what, ": weight must have the features' dtype ", dtype_text(like.scalar_type()),
                         ", got ", dtype_text(w.scalar_type())));
  check_same_device(w, "weight", like, "the features");
  return w.data_ptr();
}

inline SegmentReduceParams segment_reduce_params(const at::Tensor& rowptr, const at::Tensor& col,
                                                 const at::Tensor& x, int64_t num_rows,
                                                 int64_t num_cols, c10::string_view reduce,
                                                 const c10::optional<at::Tensor>& weight,
                                                 const at::Tensor& out, const at::Tensor& arg) {
  check_csr(rowptr, col, num_rows, "segment_reduce");
  TORCH_CHECK_VALUE(x.dim() == 2, text("segment_reduce: x must be 2-D, got ", sizes_text(x.sizes())));
  TORCH_CHECK_VALUE(x.size(0) == num_cols, text("segment_reduce: x has ", x.size(0),
                                                " rows but the graph has ", num_cols, " source nodes"));
  TORCH_CHECK_VALUE(x.stride(1) == 1 || x.size(1) <= 1 || x.numel() == 0,
                    "segment_reduce: x must have unit feature stride");
  check_same_device(rowptr, "rowptr", x, "x");
  check_same_device(col, "col", x, "x");
  SegmentReduceParams p;
  p.rowptr = rowptr.data_ptr();
  p.col = col.data_ptr();
  p.index_type = index_type_of(rowptr, "rowptr");
  p.x = x.data_ptr();
  p.weight = slot_weight_of(weight, col, x, "segment_reduce");
  p.out = out.data_ptr();
  p.arg = arg.data_ptr();
  p.scalar_type = scalar_type_of(x, "x");
  p.op = reduce_op_of(reduce);
  p.num_rows = num_rows;
  p.num_cols = num_cols;
  p.nnz = col.numel();
  p.width = x.size(1);
  p.x_row_stride = x.stride(0);  // also for width 1: a column slice keeps its row stride
  return p;
}

inline SegmentReduceBackwardParams segment_reduce_backward_params(
    const at::Tensor& rowptr_t, const at::Tensor& col_t, const at::Tensor& t2c,
    const at::Tensor& arg, const at::Tensor& grad_out, int64_t num_src,
    const c10::optional<at::Tensor>& weight, const at::Tensor& grad_x) {
  check_csr(rowptr_t, col_t, num_src, "segment_reduce backward");
  TORCH_CHECK_VALUE(t2c.numel() == col_t.numel() && t2c.scalar_type() == col_t.scalar_type() &&
                        t2c.is_contiguous(),
                    "segment_reduce backward: t2c must be a contiguous tensor like col_t");
  for (const at::Tensor* t : {&col_t, &t2c, &arg}) check_same_device(*t, "index", grad_out, "grad_out");
  check_same_device(rowptr_t, "rowptr_t", grad_out, "grad_out");
  TORCH_CHECK_VALUE(arg.sizes() == grad_out.sizes() && arg.scalar_type() == col_t.scalar_type(),
                    "segment_reduce backward: arg must be [num_dst, width] of the index dtype");
  TORCH_CHECK_VALUE(grad_out.is_contiguous() && arg.is_contiguous(),
                    "segment_reduce backward: grad_out and arg must be contiguous");
  SegmentReduceBackwardParams p;
  p.rowptr_t = rowptr_t.data_ptr();
  p.col_t = col_t.data_ptr();
  p.t2c = t2c.data_ptr();
  p.arg = arg.data_ptr();
  p.index_type = index_type_of(rowptr_t, "rowptr_t");
  p.weight = slot_weight_of(weight, col_t, grad_out, "segment_reduce backward");
  p.grad_out = grad_out.data_ptr();
  p.grad_x = grad_x.data_ptr();
  p.scalar_type = scalar_type_of(grad_out, "grad_out");
  p.num_src = num_src;
  p.width = grad_out.size(1);
  return p;
}

// grad_weight: [nnz] zeros of the accumulator type (float, double for float64), which the
// caller casts to x's dtype.
inline SegmentReduceWeightGradParams segment_reduce_weight_grad_params(
    const at::Tensor& col, const at::Tensor& x, const at::Tensor& arg, const at::Tensor& grad_out,
    const at::Tensor& grad_weight) {
  TORCH_CHECK_VALUE(col.dim() == 1 && col.is_contiguous(),
                    "segment_reduce weight gradient: col must be a contiguous 1-D tensor");
  TORCH_CHECK_VALUE(x.dim() == 2 && (x.stride(1) == 1 || x.size(1) <= 1),
                    "segment_reduce weight gradient: x must be 2-D with unit feature stride");
  TORCH_CHECK_VALUE(grad_out.dim() == 2 && grad_out.size(1) == x.size(1) && grad_out.is_contiguous(),
                    text("segment_reduce weight gradient: grad_out must be a contiguous [num_dst, ",
                         x.size(1), "] tensor, got ", sizes_text(grad_out.sizes())));
  TORCH_CHECK_VALUE(arg.sizes() == grad_out.sizes() && arg.scalar_type() == col.scalar_type() &&
                        arg.is_contiguous(),
                    "segment_reduce weight gradient: arg must be [num_dst, width] of the index dtype");
  TORCH_CHECK_VALUE(grad_out.scalar_type() == x.scalar_type(),
                    "segment_reduce weight gradient: grad_out and x must have one dtype");
  for (const at::Tensor* t : {&col, &arg, &grad_out}) check_same_device(*t, "input", x, "x");
  SegmentReduceWeightGradParams p;
  p.col = col.data_ptr();
  p.arg = arg.data_ptr();
  p.index_type = index_type_of(col, "col");
  p.x = x.data_ptr();
  p.grad_out = grad_out.data_ptr();
  p.grad_weight = grad_weight.data_ptr();
  p.scalar_type = scalar_type_of(x, "x");
  p.num_rows = grad_out.size(0);
  p.width = grad_out.size(1);
  p.x_row_stride = x.stride(0);
  return p;
}

inline at::ScalarType weight_grad_acc_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

}  // namespace gnnio::binding
