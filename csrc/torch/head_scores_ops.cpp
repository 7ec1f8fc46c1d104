// CPU implementation and autograd of gnnio::head_scores (GAT's per-node scores, fused).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/VariableTypeUtils.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>

#include "head_scores_common.h"

namespace gnnio::binding {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor head_scores_cpu_impl(const at::Tensor& x, const at::Tensor& att) {
  at::Tensor score;
  const auto p = head_scores_params(x, att, score);
  translate_errors([&] { head_scores_cpu(p); });
  return score;
}

std::tuple<at::Tensor, at::Tensor> head_scores_backward_cpu_impl(
    const at::Tensor& x, const at::Tensor& att, const at::Tensor& grad_score, bool x_grad,
    bool att_grad, const c10::optional<at::Tensor>& grad_x_into) {
  at::Tensor grad_x, partials;
  const auto p = head_scores_backward_params(x, att, grad_score, x_grad, att_grad, grad_x_into,
                                            grad_x, partials);
  translate_errors([&] { head_scores_backward_cpu(p); });
  return head_scores_grads(x, att, grad_x, partials);
}

at::Tensor call_forward(const at::Tensor& x, const at::Tensor& att) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("gnnio::head_scores", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  return op.call(x, att);
}

std::tuple<at::Tensor, at::Tensor> call_backward(const at::Tensor& x, const at::Tensor& att,
                                                 const at::Tensor& grad_score, bool x_grad,
                                                 bool att_grad,
                                                 const c10::optional<at::Tensor>& grad_x_into = c10::nullopt) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("gnnio::head_scores_backward", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&, bool, bool,
                           const c10::optional<at::Tensor>&)>();
  return op.call(x, att, grad_score, x_grad, att_grad, grad_x_into);
}

class HeadScoresFunction : public torch::autograd::Function<HeadScoresFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& att) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto score = call_forward(x, att);
    const bool x_grad = x.requires_grad(), att_grad = att.requires_grad();
    if (x_grad || att_grad) ctx->save_for_backward({x, att});
    ctx->saved_data["x_grad"] = x_grad;
    ctx->saved_data["att_grad"] = att_grad;
    return score;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const bool x_grad = ctx->saved_data["x_grad"].toBool();
    const bool att_grad = ctx->saved_data["att_grad"].toBool();
    if (!grads[0].defined() || !(x_grad || att_grad)) return {at::Tensor(), at::Tensor()};
    // x is kept even when only d x is needed: the attention op that reads the scores keeps the
    // same tensor, so saving it here costs no memory.
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& x = saved[0];
    const at::Tensor& att = saved[1];
    auto [grad_x, grad_att] =
        call_backward(x, att, grads[0].to(att.scalar_type()).contiguous(), x_grad, att_grad);
    return {x_grad ? grad_x : at::Tensor(), att_grad ? grad_att : at::Tensor()};
  }
};

at::Tensor head_scores_autograd(const at::Tensor& x, const at::Tensor& att) {
  if (!at::GradMode::is_enabled() || !(x.requires_grad() || att.requires_grad())) {
    at::AutoDispatchBelowADInplaceOrView guard;
    return call_forward(x, att);
  }
  return HeadScoresFunction::apply(x, att);
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, CPU, m) {
  m.impl("head_scores", &head_scores_cpu_impl);
  m.impl("head_scores_backward", &head_scores_backward_cpu_impl);
}

// The backward op has no derivative of its own; with grad_x_into it writes into that tensor, so
// that tensor's version counter is bumped, as for any in-place op (attention_autograd.cpp's call
// goes below the autograd keys, into a tensor it has just made).
std::tuple<at::Tensor, at::Tensor> head_scores_backward_autograd(
    const at::Tensor& x, const at::Tensor& att, const at::Tensor& grad_score, bool x_grad,
    bool att_grad, const c10::optional<at::Tensor>& grad_x_into) {
  TORCH_CHECK(!at::GradMode::is_enabled() ||
                  !(x.requires_grad() || att.requires_grad() || grad_score.requires_grad()),
              "gnnio::head_scores_backward is not differentiable (no double backward of head_scores)");
  std::tuple<at::Tensor, at::Tensor> grads;
  {
    at::AutoDispatchBelowADInplaceOrView guard;
    grads = call_backward(x, att, grad_score, x_grad, att_grad, grad_x_into);
  }
  if (grad_x_into.has_value()) torch::autograd::increment_version(*grad_x_into);
  return grads;
}

TORCH_LIBRARY_IMPL(gnnio, Autograd, m) {
  m.impl("head_scores", &head_scores_autograd);
  m.impl("head_scores_backward", &head_scores_backward_autograd);
}

}  // namespace gnnio::binding
