// CUDA implementations of GAT attention on WSB tiles (gnnio/wsb/attention.h).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../wsb_attention_common.h"

namespace gnnio::binding {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> wsb_gat_attention_cuda(
    const at::Tensor& block_rowptr, const at::Tensor& block_col, const at::Tensor& count,
    const at::Tensor& src_score, const OptTensor& dst_score, const at::Tensor& value,
    int64_t num_src, int64_t num_dst, double negative_slope, bool save_out_acc) {
  const c10::cuda::CUDAGuard guard(value.device());
  WsbAttentionParams p = wsb_attention_params(block_rowptr, block_col, count, src_score, dst_score,
                                              value, num_src, num_dst, negative_slope);
  auto outputs = wsb_attention_outputs(p, value, save_out_acc);
  translate_errors([&] { wsb_attention_forward_cuda(p, at::cuda::getCurrentCUDAStream().stream()); });
  return outputs;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> wsb_gat_attention_backward_cuda(
    const at::Tensor& block_rowptr, const at::Tensor& block_col, const at::Tensor& count,
    const at::Tensor& block_rowptr_t, const at::Tensor& block_col_t, const at::Tensor& count_t,
    const at::Tensor& src_score, const OptTensor& dst_score, const at::Tensor& value,
    const at::Tensor& out, const at::Tensor& stats, const at::Tensor& grad_out,
    double negative_slope, at::IntArrayRef needs) {
  const c10::cuda::CUDAGuard guard(value.device());
  WsbAttentionGrads g;
  const at::Tensor g_out = grad_out.contiguous();
  const auto b = wsb_attention_backward_params(block_rowptr, block_col, count, block_rowptr_t,
                                               block_col_t, count_t, src_score, dst_score, value,
                                               out, stats, g_out, negative_slope, needs, g);
  translate_errors([&] { wsb_attention_backward_cuda(b, at::cuda::getCurrentCUDAStream().stream()); });
  return {g.src_score, g.dst_score, g.value};
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) {
  m.impl("wsb_gat_attention", &wsb_gat_attention_cuda);
  m.impl("wsb_gat_attention_backward", &wsb_gat_attention_backward_cuda);
}

}  // namespace gnnio::binding
