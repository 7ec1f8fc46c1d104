// CUDA implementation of gnnio::transformer_fused_forward (gnnio/transformer/params.h): the
// fused tile kernel, with the planner's split of csr_by_dst (heavy rows walked in items).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../transformer_common.h"

namespace gnnio::binding {
namespace {

std::tuple<at::Tensor, at::Tensor> transformer_fused_forward_cuda_impl(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& x, const at::Tensor& query,
    const at::Tensor& w_key, const at::Tensor& w_value_t, const c10::optional<at::Tensor>& b_value,
    const c10::optional<at::Tensor>& residual, double scale,
    const c10::optional<at::Tensor>& heavy_rows, const c10::optional<at::Tensor>& heavy_items,
    int64_t light_max_degree,
    const c10::optional<at::Tensor>& b_key) {
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out, stats;
  const TransformerFusedOperands o(x, query, w_key, w_value_t, b_value, residual, b_key,
                                   /*align16=*/true);
  auto p = transformer_fused_params(rowptr, col, o.x, o.query, o.w_key, o.w_value_t, o.b_value,
                                    o.residual, o.b_key, scale, out, stats);
  p.split = row_split_of(heavy_rows, heavy_items, light_max_degree, x, "transformer_fused_forward");
  translate_errors([&] {
    auto ws = at::empty({static_cast<int64_t>(transformer_fused_cuda_workspace_bytes(p))},
                        x.options().dtype(at::kByte));
    transformer_fused_forward_cuda(p, ws.data_ptr(), at::cuda::getCurrentCUDAStream().stream());
  });
  return {out, stats};
}

void transformer_fused_inference_cuda_impl(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& x, const at::Tensor& query,
    const at::Tensor& w_key, const at::Tensor& w_value_t, const c10::optional<at::Tensor>& b_value,
    at::Tensor& residual, double scale, const c10::optional<at::Tensor>& heavy_rows,
    const c10::optional<at::Tensor>& heavy_items, int64_t light_max_degree) {
  const c10::cuda::CUDAGuard guard(x.device());
  check_residual_in_place(residual, /*align16=*/true);
  at::Tensor out, stats;
  const TransformerFusedOperands o(x, query, w_key, w_value_t, b_value, residual, c10::nullopt,
                                   /*align16=*/true);
  auto p = transformer_fused_params(rowptr, col, o.x, o.query, o.w_key, o.w_value_t, o.b_value,
                                    o.residual, c10::nullopt, scale, out, stats,
                                    /*into_residual=*/true);
  p.split = row_split_of(heavy_rows, heavy_items, light_max_degree, x, "transformer_fused_inference");
  translate_errors([&] {
    auto ws = at::empty({static_cast<int64_t>(transformer_fused_cuda_workspace_bytes(p))},
                        x.options().dtype(at::kByte));
    transformer_fused_forward_cuda(p, ws.data_ptr(), at::cuda::getCurrentCUDAStream().stream());
  });
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) {
  m.impl("transformer_fused_forward", &transformer_fused_forward_cuda_impl);
  m.impl("transformer_fused_inference", &transformer_fused_inference_cuda_impl);
}

}  // namespace gnnio::binding
