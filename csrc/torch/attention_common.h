// Validation and params filling for the attention family (shared by the CPU and CUDA bindings).
#pragma once

#include "common.h"
#include "gnnio/attention/params.h"
#include "spmm_common.h"

namespace gnnio::binding {

inline GatParams gat_params(const at::Tensor& rowptr, const at::Tensor& col,
                            const at::Tensor& alpha_src, const c10::optional<at::Tensor>& alpha_dst,
                            const at::Tensor& h_src, int64_t num_dst, double negative_slope) {
  check_csr(rowptr, col, num_dst, "gat");
  TORCH_CHECK_VALUE(h_src.dim() == 3 && h_src.is_contiguous(),
                    text("gat: h_src must be contiguous [num_src, heads, channels], got ",
                         sizes_text(h_src.sizes())));
  const int64_t num_src = h_src.size(0), heads = h_src.size(1);
  TORCH_CHECK_VALUE(alpha_src.dim() == 2 && alpha_src.size(0) == num_src &&
                        alpha_src.size(1) == heads && alpha_src.is_contiguous(),
                    text("gat: alpha_src must be contiguous [num_src, heads] = [", num_src, ", ",
                         heads, "], got ", sizes_text(alpha_src.sizes())));
  TORCH_CHECK_TYPE(alpha_src.scalar_type() == h_src.scalar_type(), "gat: alpha_src and h_src must share a dtype");
  for (const at::Tensor* t : {&rowptr, &col, &alpha_src}) check_same_device(*t, "graph/alpha", h_src, "h_src");
  GatParams p;
  if (alpha_dst.has_value()) {
    TORCH_CHECK_VALUE(alpha_dst->dim() == 2 && alpha_dst->size(0) == num_dst &&
                          alpha_dst->size(1) == heads && alpha_dst->is_contiguous(),
                      text("gat: alpha_dst must be contiguous [num_dst, heads] = [", num_dst, ", ",
                           heads, "], got ", sizes_text(alpha_dst->sizes())));
    TORCH_CHECK_TYPE(alpha_dst->scalar_type() == h_src.scalar_type(), "gat: alpha_dst and h_src must share a dtype");
    check_same_device(*alpha_dst, "alpha_dst", h_src, "h_src");
    p.alpha_dst = alpha_dst->data_ptr();
  }
  p.rowptr = rowptr.data_ptr();
  p.col = col.data_ptr();
  p.index_type = index_type_of(rowptr, "rowptr");
  p.alpha_src = alpha_src.data_ptr();
  p.h_src = h_src.data_ptr();
  p.scalar_type = scalar_type_of(h_src, "h_src");
  p.num_dst = num_dst;
  p.num_src = num_src;
  p.heads = heads;
  p.channels = h_src.size(2);
  p.negative_slope = negative_slope;
  return p;
}

}  // namespace gnnio::binding
