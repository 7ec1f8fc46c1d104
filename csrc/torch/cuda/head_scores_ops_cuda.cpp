// CUDA implementation of gnnio::head_scores (GAT's per-node scores, fused).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../head_scores_common.h"

namespace gnnio::binding {
namespace {

at::Tensor head_scores_cuda_impl(const at::Tensor& x, const at::Tensor& att) {
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor score;
  const auto p = head_scores_params(x, att, score);
  translate_errors([&] { head_scores_cuda(p, at::cuda::getCurrentCUDAStream().stream()); });
  return score;
}

std::tuple<at::Tensor, at::Tensor> head_scores_backward_cuda_impl(
    const at::Tensor& x, const at::Tensor& att, const at::Tensor& grad_score, bool x_grad,
    bool att_grad, const c10::optional<at::Tensor>& grad_x_into) {
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor grad_x, partials;
  const auto p = head_scores_backward_params(x, att, grad_score, x_grad, att_grad, grad_x_into,
                                            grad_x, partials);
  translate_errors([&] { head_scores_backward_cuda(p, at::cuda::getCurrentCUDAStream().stream()); });
  return head_scores_grads(x, att, grad_x, partials);
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) {
  m.impl("head_scores", &head_scores_cuda_impl);
  m.impl("head_scores_backward", &head_scores_backward_cuda_impl);
}

}  // namespace gnnio::binding
