// Validation and params filling for GAT attention on WSB tiles (gnnio/wsb/attention.h), shared
// by the CPU and CUDA bindings. The structure (block_rowptr, block_col, the count tiles) is
// trusted as in wsb_spmm: gnnio.Graph builds it from a checked edge_index.
#pragma once

#include <tuple>
#include <vector>

#include "common.h"
#include "gnnio/wsb/attention.h"
#include "wsb_common.h"

namespace gnnio::binding {

using OptTensor = c10::optional<at::Tensor>;

inline void check_count(const at::Tensor& count, const at::Tensor& block_col, const char* name) {
  TORCH_CHECK_VALUE(count.scalar_type() == at::kFloat && count.is_contiguous() &&
                        count.sizes() == at::IntArrayRef({block_col.numel(), kWsbTile, kWsbTile}),
                    text("wsb_gat_attention: ", name, " must be contiguous float32 [num_tiles = ",
                         block_col.numel(), ", 16, 16], got ", sizes_text(count.sizes()), " ",
                         dtype_text(count.scalar_type())));
}

// Checks the forward's operands and fills the params (out, out_acc, stats left unset).
inline WsbAttentionParams wsb_attention_params(const at::Tensor& block_rowptr,
                                               const at::Tensor& block_col, const at::Tensor& count,
                                               const at::Tensor& src_score,
                                               const OptTensor& dst_score, const at::Tensor& value,
                                               int64_t num_src, int64_t num_dst,
                                               double negative_slope) {
  check_wsb(block_rowptr, block_col, num_dst, "wsb_gat_attention");
  check_count(count, block_col, "count");
  TORCH_CHECK_VALUE(value.dim() == 3 && value.is_contiguous(),
                    text("wsb_gat_attention: value must be contiguous [num_src, heads, channels], got ",
                         sizes_text(value.sizes())));
  const int64_t ns = value.size(0), heads = value.size(1), channels = value.size(2);
  TORCH_CHECK_VALUE(ns == num_src, text("wsb_gat_attention: value has ", ns, " rows but the tiles have ",
                                        num_src, " columns (sources)"));
  TORCH_CHECK_VALUE(channels <= kWsbAttentionMaxChannels,
                    text("wsb_gat_attention: at most ", kWsbAttentionMaxChannels,
                         " channels a head, got ", channels, " (use the CSR kernels)"));
  TORCH_CHECK_VALUE(src_score.sizes() == at::IntArrayRef({ns, heads}) && src_score.is_contiguous(),
                    text("wsb_gat_attention: src_score must be contiguous [num_src, heads] = [", ns,
                         ", ", heads, "], got ", sizes_text(src_score.sizes())));
  TORCH_CHECK_TYPE(src_score.scalar_type() == value.scalar_type(),
                   "wsb_gat_attention: src_score must have value's dtype");
  check_same_device(src_score, "src_score", value, "value");
  check_same_device(block_rowptr, "block_rowptr", value, "value");
  check_same_device(block_col, "block_col", value, "value");
  check_same_device(count, "count", value, "value");
  WsbAttentionParams p;
  if (dst_score.has_value()) {
    TORCH_CHECK_VALUE(dst_score->sizes() == at::IntArrayRef({num_dst, heads}) && dst_score->is_contiguous(),
                      text("wsb_gat_attention: dst_score must be contiguous [num_dst, heads] = [",
                           num_dst, ", ", heads, "], got ", sizes_text(dst_score->sizes())));
    TORCH_CHECK_TYPE(dst_score->scalar_type() == value.scalar_type(),
                     "wsb_gat_attention: dst_score must have value's dtype");
    check_same_device(*dst_score, "dst_score", value, "value");
    p.dst_score = dst_score->data_ptr();
  }
  p.block_rowptr = block_rowptr.data_ptr();
  p.block_col = block_col.data_ptr();
  p.index_type = index_type_of(block_rowptr, "block_rowptr");
  p.count = count.data_ptr<float>();
  p.num_tiles = block_col.numel();
  p.scalar_type = scalar_type_of(value, "value");
  p.num_dst = num_dst;
  p.num_src = ns;
  p.heads = heads;
  p.channels = channels;
  p.src_score = src_score.data_ptr();
  p.negative_slope = negative_slope;
  p.value = value.data_ptr();
  return p;
}

// out [num_dst, H, C], stats [num_dst, H, 2] (float32; float64 for float64), and out_acc
// [num_dst, H, C] float32 when save_out_acc and value is 16-bit (else empty).
inline std::tuple<at::Tensor, at::Tensor, at::Tensor> wsb_attention_outputs(
    WsbAttentionParams& p, const at::Tensor& value, bool save_out_acc) {
  const auto stats_dtype = value.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  auto out = at::empty({p.num_dst, p.heads, p.channels}, value.options());
  auto stats = at::empty({p.num_dst, p.heads, 2}, value.options().dtype(stats_dtype));
  const bool acc = save_out_acc && value.element_size() == 2;
  auto out_acc = acc ? at::empty({p.num_dst, p.heads, p.channels}, value.options().dtype(at::kFloat))
                     : at::empty({0}, value.options().dtype(at::kFloat));
  p.out = out.data_ptr();
  p.stats = stats.data_ptr();
  p.out_acc = acc ? out_acc.data_ptr() : nullptr;
  return {out, stats, out_acc};
}

struct WsbAttentionGrads {
  at::Tensor src_score, dst_score, value, delta;
};

// The backward's params; `out` is the forward's out or its float32 out_acc (16-bit value).
// needs = (src_score, dst_score, value).
inline WsbAttentionBackwardParams wsb_attention_backward_params(
    const at::Tensor& block_rowptr, const at::Tensor& block_col, const at::Tensor& count,
    const at::Tensor& block_rowptr_t, const at::Tensor& block_col_t, const at::Tensor& count_t,
    const at::Tensor& src_score, const OptTensor& dst_score, const at::Tensor& value,
    const at::Tensor& out, const at::Tensor& stats, const at::Tensor& grad_out,
    double negative_slope, at::IntArrayRef needs, WsbAttentionGrads& g) {
  WsbAttentionBackwardParams b;
  b.fwd = wsb_attention_params(block_rowptr, block_col, count, src_score, dst_score, value,
                               value.size(0), stats.size(0), negative_slope);
  const WsbAttentionParams& p = b.fwd;
  // The transpose's block rows are the sources: value's rows.
  check_wsb(block_rowptr_t, block_col_t, p.num_src, "wsb_gat_attention (transpose)");
  TORCH_CHECK_VALUE(block_rowptr_t.scalar_type() == block_rowptr.scalar_type(),
                    "wsb_gat_attention_backward: the transposed tiles must have the forward's index dtype");
  check_count(count_t, block_col_t, "count_t");
  TORCH_CHECK_VALUE(needs.size() == 3, "wsb_gat_attention_backward: needs has 3 flags");
  check_same_device(block_rowptr_t, "block_rowptr_t", value, "value");
  check_same_device(block_col_t, "block_col_t", value, "value");
  check_same_device(count_t, "count_t", value, "value");
  check_same_device(out, "out", value, "value");
  check_same_device(stats, "stats", value, "value");
  check_same_device(grad_out, "grad_out", value, "value");
  const std::vector<int64_t> shape{p.num_dst, p.heads, p.channels};
  TORCH_CHECK_VALUE(grad_out.sizes() == at::IntArrayRef(shape) && grad_out.is_contiguous() &&
                        grad_out.scalar_type() == value.scalar_type(),
                    "wsb_gat_attention_backward: grad_out must be contiguous like out");
  TORCH_CHECK_VALUE(out.sizes() == at::IntArrayRef(shape) && out.is_contiguous() &&
                        (out.scalar_type() == value.scalar_type() || out.scalar_type() == at::kFloat),
                    "wsb_gat_attention_backward: out must be contiguous [num_dst, H, C] in value's "
                    "dtype or float32");
  const auto acc_dtype = value.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  TORCH_CHECK_VALUE(stats.sizes() == at::IntArrayRef({p.num_dst, p.heads, 2}) &&
                        stats.scalar_type() == acc_dtype && stats.is_contiguous(),
                    "wsb_gat_attention_backward: stats must be the forward's");
  auto& bw = b;
  if (out.scalar_type() != value.scalar_type()) bw.fwd.out_acc = out.data_ptr();
  else bw.fwd.out = out.data_ptr();
  bw.fwd.stats = stats.data_ptr();
  bw.grad_out = grad_out.data_ptr();
  bw.block_rowptr_t = block_rowptr_t.data_ptr();
  bw.block_col_t = block_col_t.data_ptr();
  bw.count_t = count_t.data_ptr<float>();
  g.delta = at::empty({p.num_dst, p.heads}, value.options().dtype(acc_dtype));
  bw.delta = g.delta.data_ptr();
  if (needs[0]) {
    g.src_score = at::empty_like(src_score);
    bw.grad_src_score = g.src_score.data_ptr();
  }
  if (needs[1] && dst_score.has_value()) {
    g.dst_score = at::empty_like(*dst_score);
    bw.grad_dst_score = g.dst_score.data_ptr();
  }
  if (needs[2]) {
    g.value = at::empty_like(value);
    bw.grad_value = g.value.data_ptr();
  }
  return bw;
}

}  // namespace gnnio::binding
