// CUDA implementation of gnnio::transformer_fused_forward (gnnio/transformer/params.h): the
// fused tile kernel, with the planner's split of csr_by_dst (heavy rows walked in items).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdlib>
#include <string>

#include "../transformer_common.h"

namespace gnnio::binding {
namespace {

std::tuple<at::Tensor, at::Tensor> transformer_fused_forward_cuda_impl(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& x, const at::Tensor& query,
    const at::Tensor& w_key, const at::Tensor& w_value_t, const c10::optional<at::Tensor>& b_value,
    const c10::optional<at::Tensor>& residual, double scale,
    const c10::optional<at::Tensor>& heavy_rows, const c10::optional<at::Tensor>& heavy_items,
    const c10::optional<at::Tensor>& item_offsets, int64_t light_max_degree,
    const c10::optional<at::Tensor>& b_key) {
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out, stats;
  const TransformerFusedOperands o(x, query, w_key, w_value_t, b_value, residual, b_key,
                                   /*align16=*/true);
  auto p = transformer_fused_params(rowptr, col, o.x, o.query, o.w_key, o.w_value_t, o.b_value,
                                    o.residual, o.b_key, scale, out, stats);
  p.split = row_split_of(heavy_rows, heavy_items, light_max_degree, x, "transformer_fused_forward");
  if (p.split.num_heavy > 0) {
    TORCH_CHECK_VALUE(item_offsets && item_offsets->scalar_type() == at::kLong &&
                          item_offsets->dim() == 1 && item_offsets->is_contiguous() &&
                          item_offsets->numel() == p.split.num_heavy + 1,
                      "transformer_fused_forward: item_offsets must be int64 [num_heavy + 1]");
    check_same_device(*item_offsets, "item_offsets", x, "x");
    p.split.item_offsets = item_offsets->data_ptr<int64_t>();
  }
  const char* walk = std::getenv("GNNIO_FUSED_WALK");  // "registers" (unmeasured) or the default
  p.register_walk = walk && std::string(walk) == "registers";
  translate_errors([&] {
    auto ws = at::empty({static_cast<int64_t>(transformer_fused_cuda_workspace_bytes(p))},
                        x.options().dtype(at::kByte));
    transformer_fused_forward_cuda(p, ws.data_ptr(), at::cuda::getCurrentCUDAStream().stream());
  });
  return {out, stats};
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) {
  m.impl("transformer_fused_forward", &transformer_fused_forward_cuda_impl);
}

}  // namespace gnnio::binding
