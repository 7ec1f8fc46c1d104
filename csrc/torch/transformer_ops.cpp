// CPU implementation of gnnio::transformer_fused_forward (gnnio/transformer/params.h). Its
// backward is the direct form's (gnnio/nn/conv/_reassociated.py), so the op has no autograd.
#include "transformer_common.h"

namespace gnnio::binding {
namespace {

std::tuple<at::Tensor, at::Tensor> transformer_fused_forward_cpu_impl(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& x, const at::Tensor& query,
    const at::Tensor& w_key, const at::Tensor& w_value_t, const c10::optional<at::Tensor>& b_value,
    const c10::optional<at::Tensor>& residual, double scale, const c10::optional<at::Tensor>&,
    const c10::optional<at::Tensor>&, int64_t, const c10::optional<at::Tensor>& b_key) {
  at::Tensor out, stats;
  const TransformerFusedOperands o(x, query, w_key, w_value_t, b_value, residual, b_key);
  const auto p = transformer_fused_params(rowptr, col, o.x, o.query, o.w_key, o.w_value_t,
                                          o.b_value, o.residual, o.b_key, scale, out, stats);
  translate_errors([&] { transformer_fused_forward_cpu(p); });
  return {out, stats};
}

void transformer_fused_inference_cpu_impl(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& x, const at::Tensor& query,
    const at::Tensor& w_key, const at::Tensor& w_value_t, const c10::optional<at::Tensor>& b_value,
    at::Tensor& residual, double scale, const c10::optional<at::Tensor>&,
    const c10::optional<at::Tensor>&, int64_t) {
  check_residual_in_place(residual, /*align16=*/false);
  at::Tensor out, stats;
  const TransformerFusedOperands o(x, query, w_key, w_value_t, b_value, residual, c10::nullopt);
  const auto p = transformer_fused_params(rowptr, col, o.x, o.query, o.w_key, o.w_value_t,
                                          o.b_value, o.residual, c10::nullopt, scale, out, stats,
                                          /*into_residual=*/true);
  translate_errors([&] { transformer_fused_forward_cpu(p); });
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, CPU, m) {
  m.impl("transformer_fused_forward", &transformer_fused_forward_cpu_impl);
  m.impl("transformer_fused_inference", &transformer_fused_inference_cpu_impl);
}

}  // namespace gnnio::binding
