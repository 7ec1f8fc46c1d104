// CPU implementations of the attention family.
#include "attention_common.h"

namespace gnnio::binding {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> graph_attention_cpu_impl(
    const at::Tensor& rowptr, const at::Tensor& col, int64_t kind, const at::Tensor& value,
    const OptTensor& src_score, const OptTensor& dst_score, const OptTensor& edge_score,
    const OptTensor& query, const OptTensor& key, const OptTensor& edge_key, const OptTensor& att,
    const OptTensor& edge_value, int64_t num_dst, double negative_slope, double scale,
    double dropout, int64_t seed, bool need_weights, const at::Tensor& rowptr_t,
    const at::Tensor& col_t, const at::Tensor& t2c, const OptTensor& heavy_rows,
    const OptTensor& heavy_items, int64_t light_max_degree, const OptTensor& heavy_src,
    const OptTensor& heavy_src_items, int64_t light_max_out_degree, bool save_out_acc,
    const OptTensor& bias, bool /*backward_in_place: the autograd's*/) {
  auto in = attention_inputs(rowptr, col, kind, value, src_score, dst_score, edge_score, query,
                             key, edge_key, att, edge_value, num_dst, negative_slope, scale,
                             dropout, seed, rowptr_t, col_t, t2c, heavy_rows, heavy_items,
                             light_max_degree, heavy_src, heavy_src_items, light_max_out_degree);
  AttentionParams p = attention_params(in);
  at::Tensor scores;  // GAT with att: the scores first (the CUDA kernel forms them from rows)
  if (gat_att_given(in)) {
    scores = gat_scores_of(value, *att);
    in = with_gat_scores(std::move(in), scores);
    p = attention_params(in);
  }
  set_output_bias(p, value, bias);
  auto [out, stats, weights, out_acc] = attention_outputs(p, value, need_weights, save_out_acc);
  translate_errors([&] { attention_forward_cpu(p); });
  return {out, stats, weights, out_acc};
}

std::vector<at::Tensor> graph_attention_backward_cpu_impl(
    const at::Tensor& rowptr, const at::Tensor& col, int64_t kind, const at::Tensor& value,
    const c10::List<OptTensor>& operands, int64_t num_dst, at::ArrayRef<double> coeffs, int64_t seed,
    const at::Tensor& rowptr_t, const at::Tensor& col_t, const at::Tensor& t2c,
    const c10::List<OptTensor>& splits, at::IntArrayRef light_max, const at::Tensor& out,
    const at::Tensor& stats, const at::Tensor& grad_out, at::IntArrayRef needs) {
  const auto in = attention_backward_inputs(rowptr, col, kind, value, operands, num_dst, coeffs, seed,
                                            rowptr_t, col_t, t2c, splits, light_max);
  AttentionGrads g;
  const auto g_out = grad_out.contiguous();
  const auto b = attention_backward_params(in, out, stats, g_out, needs, g);
  translate_errors([&] { attention_backward_cpu(b); });
  return attention_finish_grads(in, g);
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, CPU, m) {
  m.impl("graph_attention", &graph_attention_cpu_impl);
  m.impl("graph_attention_backward", &graph_attention_backward_cpu_impl);
}

}  // namespace gnnio::binding
