// CUDA implementations of the attention family.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../attention_common.h"

namespace gnnio::binding {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> graph_attention_cuda_impl(
    const at::Tensor& rowptr, const at::Tensor& col, int64_t kind, const at::Tensor& value,
    const OptTensor& src_score, const OptTensor& dst_score, const OptTensor& edge_score,
    const OptTensor& query, const OptTensor& key, const OptTensor& edge_key, const OptTensor& att,
    const OptTensor& edge_value, int64_t num_dst, double negative_slope, double scale,
    double dropout, int64_t seed, bool need_weights, const at::Tensor& rowptr_t,
    const at::Tensor& col_t, const at::Tensor& t2c, const OptTensor& heavy_rows,
    const OptTensor& heavy_items, int64_t light_max_degree, const OptTensor& heavy_src,
    const OptTensor& heavy_src_items, int64_t light_max_out_degree, bool save_out_acc,
    const OptTensor& bias, bool /*backward_in_place: the autograd's*/) {
  const c10::cuda::CUDAGuard guard(value.device());
  auto in = attention_inputs(rowptr, col, kind, value, src_score, dst_score, edge_score, query,
                             key, edge_key, att, edge_value, num_dst, negative_slope, scale,
                             dropout, seed, rowptr_t, col_t, t2c, heavy_rows, heavy_items,
                             light_max_degree, heavy_src, heavy_src_items, light_max_out_degree);
  AttentionParams p = attention_params(in);
  // Shared key and value rows: read once per slot for all heads where the kernel takes them
  // (attention_forward_cuda_shared_rows: key == value, ...), else copied per head for the
  // per-head kernel, whose sums they are anyway (the same bits). GNNIO_ATTENTION_SHARED_ROWS=0
  // always copies (a measurement knob).
  if (p.shared_kv && (need_weights || !attention_forward_cuda_shared_rows(p) ||
                      env_flag_off("GNNIO_ATTENTION_SHARED_ROWS"))) {
    in = with_rows_per_head(std::move(in));
    p = attention_params(in);
  }
  // GAT with att: the kernel forms the scores from the value rows it gathers, where it can
  // (attention_forward_cuda_gat_scores_from_rows); otherwise head_scores first, the same bits.
  // GNNIO_GAT_SCORES_FROM_ROWS=0 always takes the second way (a measurement knob).
  at::Tensor scores;
  if (gat_att_given(in) &&
      (!attention_forward_cuda_gat_scores_from_rows(p) || env_flag_off("GNNIO_GAT_SCORES_FROM_ROWS"))) {
    scores = gat_scores_of(value, *att);
    in = with_gat_scores(std::move(in), scores);
    p = attention_params(in);
  }
  set_output_bias(p, value, bias);
  auto [out, stats, weights, out_acc] = attention_outputs(p, value, need_weights, save_out_acc);
  translate_errors([&] {
    auto ws = at::empty({static_cast<int64_t>(attention_forward_cuda_workspace_bytes(p))},
                        value.options().dtype(at::kByte));
    attention_forward_cuda(p, ws.data_ptr(), at::cuda::getCurrentCUDAStream().stream());
  });
  return {out, stats, weights, out_acc};
}

// The backward's gradients for in (attention_finish_grads' list).
std::vector<at::Tensor> backward_cuda_grads(const AttentionInputs& in, const at::Tensor& out,
                                            const at::Tensor& stats, const at::Tensor& g_out,
                                            at::IntArrayRef needs) {
  const at::Tensor& value = in.value;
  const int64_t kind = in.kind;
  auto run = [&](AttentionBackwardParams b) {
    translate_errors([&] {
      b.gat_slot_grads = attention_backward_cuda_gat_slot_grads(b);  // one decision per call
      auto ws = at::empty({static_cast<int64_t>(attention_backward_cuda_workspace_bytes(b))},
                          value.options().dtype(at::kByte));
      attention_backward_cuda(b, ws.data_ptr(), at::cuda::getCurrentCUDAStream().stream());
    });
  };
  // GATv2's per-destination d att partial (N x H x C floats) is read by pass A only: run pass A
  // first without pass B's gradients, reduce and free the partial, then allocate those and run
  // pass B on the same D_i. The partial and grad_value (0.5 GiB each on powerlaw-1M-16M at
  // 4 x 32) are then never alive together.
  const bool pass_b_needed = needs[0] || needs[1 + kSrcScore] || needs[1 + kKey];
  const bool split = kind == 1 && needs[1 + kAtt] && in.operands[kAtt].has_value() && pass_b_needed;
  if (!split) {
    AttentionGrads g;
    run(attention_backward_params(in, out, stats, g_out, needs, g));
    return attention_finish_grads(in, g);
  }
  std::vector<int64_t> needs_a(needs.begin(), needs.end()), needs_b(9, 0);
  for (int i : {0, 1 + kSrcScore, 1 + kKey}) needs_b[i] = needs[i], needs_a[i] = 0;
  AttentionGrads ga, gb;
  run(attention_backward_params(in, out, stats, g_out, needs_a, ga));
  auto grads = attention_finish_grads(in, ga);  // reduces d att
  ga.att_partial = at::Tensor();                // and frees its partial
  // Pass B takes the D_i of the first call (from delta_kernel, or formed by pass A) in place of
  // out, as the autograd passes it: no second delta buffer, delta_kernel not run again.
  run(attention_backward_params(in, ga.delta, stats, g_out, needs_b, gb));
  grads[0] = gb.value;
  grads[1 + kSrcScore] = gb.operands[kSrcScore];
  grads[1 + kKey] = gb.operands[kKey];
  return grads;
}

std::vector<at::Tensor> graph_attention_backward_cuda_impl(
    const at::Tensor& rowptr, const at::Tensor& col, int64_t kind, const at::Tensor& value,
    const c10::List<OptTensor>& operands, int64_t num_dst, at::ArrayRef<double> coeffs, int64_t seed,
    const at::Tensor& rowptr_t, const at::Tensor& col_t, const at::Tensor& t2c,
    const c10::List<OptTensor>& splits, at::IntArrayRef light_max, const at::Tensor& out,
    const at::Tensor& stats, const at::Tensor& grad_out, at::IntArrayRef needs) {
  const c10::cuda::CUDAGuard guard(value.device());
  const auto in = attention_backward_inputs(rowptr, col, kind, value, operands, num_dst, coeffs, seed,
                                            rowptr_t, col_t, t2c, splits, light_max);
  const auto g_out = grad_out.contiguous();
  if (!shared_rows(in)) return backward_cuda_grads(in, out, stats, g_out, needs);
  // Shared key and value rows: the per-head backward on the rows copied per head (the forward's
  // sums, so its stats hold), the copies' gradients summed over heads. Never in place (needs 3):
  // the copies are not the caller's memory.
  std::vector<int64_t> per_head_needs(needs.begin(), needs.end());
  for (auto& n : per_head_needs) n = n == 3 ? 1 : n;
  auto grads = backward_cuda_grads(with_rows_per_head(in), out, stats, g_out, per_head_needs);
  for (int i : {0, 1 + kKey})
    if (grads[i].dim() == 3) grads[i] = grads[i].sum(1, /*keepdim=*/true);
  return grads;
}

at::Tensor graph_attention_delta_cuda_impl(const at::Tensor& out, const at::Tensor& grad_out) {
  const c10::cuda::CUDAGuard guard(grad_out.device());
  TORCH_CHECK_VALUE(grad_out.dim() == 3 && grad_out.is_contiguous() && out.sizes() == grad_out.sizes() &&
                        out.is_contiguous() && out.device() == grad_out.device(),
                    "graph_attention_delta: out and grad_out must be contiguous [num_dst, H, C] on one device");
  const bool out_is_acc = low_precision(grad_out) && out.scalar_type() == at::kFloat;
  TORCH_CHECK_TYPE(out.scalar_type() == grad_out.scalar_type() || out_is_acc,
                   "graph_attention_delta: out must have grad_out's dtype (or be float32 out_acc)");
  auto delta = at::empty({grad_out.size(0), grad_out.size(1)}, grad_out.options().dtype(at::kFloat));
  AttentionBackwardParams b;
  b.fwd.scalar_type = scalar_type_of(grad_out, "graph_attention_delta: grad_out");
  b.fwd.num_dst = grad_out.size(0);
  b.fwd.heads = grad_out.size(1);
  b.fwd.channels = grad_out.size(2);
  (out_is_acc ? b.fwd.out_acc : b.fwd.out) = const_cast<void*>(out.data_ptr());
  b.grad_out = grad_out.data_ptr();
  b.delta = delta.data_ptr();
  translate_errors([&] { attention_delta_cuda(b, at::cuda::getCurrentCUDAStream().stream()); });
  return delta;
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) {
  m.impl("graph_attention_delta", &graph_attention_delta_cuda_impl);
  m.impl("graph_attention", &graph_attention_cuda_impl);
  m.impl("graph_attention_backward", &graph_attention_backward_cuda_impl);
}

}  // namespace gnnio::binding
