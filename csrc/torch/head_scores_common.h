// Validation and params filling for gnnio::head_scores (shared by the CPU and CUDA bindings).
#pragma once

#include "common.h"
#include "gnnio/attention/head_scores.h"

namespace gnnio::binding {

inline at::ScalarType head_scores_acc_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

inline void check_head_scores_inputs(const at::Tensor& x, const at::Tensor& att, const char* what) {
  TORCH_CHECK_VALUE(x.dim() == 3 && x.is_contiguous(),
                    text(what, ": x must be contiguous [num_rows, heads, channels], got ",
                         sizes_text(x.sizes())));
  scalar_type_of(x, "head_scores: x");
  TORCH_CHECK_VALUE(att.dim() == 3 && att.is_contiguous() && att.size(0) >= 1 && att.size(0) <= 4 &&
                        att.size(1) == x.size(1) && att.size(2) == x.size(2),
                    text(what, ": att must be contiguous [num_att (1 to 4), ", x.size(1), ", ",
                         x.size(2), "], got ", sizes_text(att.sizes())));
  TORCH_CHECK_TYPE(att.scalar_type() == head_scores_acc_dtype(x),
                   text(what, ": att must be ", dtype_text(head_scores_acc_dtype(x)), " for x of ",
                        dtype_text(x.scalar_type()), ", got ", dtype_text(att.scalar_type())));
  check_same_device(x, "x", att, "att");
}

inline HeadScoresParams head_scores_params(const at::Tensor& x, const at::Tensor& att,
                                           at::Tensor& score) {
  check_head_scores_inputs(x, att, "head_scores");
  score = at::empty({att.size(0), x.size(0), x.size(1)}, att.options());
  HeadScoresParams p;
  p.x = x.data_ptr();
  p.att = att.data_ptr();
  p.score = score.data_ptr();
  p.scalar_type = scalar_type_of(x, "head_scores: x");
  p.num_rows = x.size(0);
  p.num_att = att.size(0);
  p.heads = x.size(1);
  p.channels = x.size(2);
  return p;
}

// Fills the backward params; grad_x and att_partials are allocated here when asked for, except
// that with grad_x_into (x's shape, dtype and device, contiguous) d x is added into that tensor.
inline HeadScoresBackwardParams head_scores_backward_params(
    const at::Tensor& x, const at::Tensor& att, const at::Tensor& grad_score, bool x_grad,
    bool att_grad, const c10::optional<at::Tensor>& grad_x_into, at::Tensor& grad_x,
    at::Tensor& att_partials) {
  check_head_scores_inputs(x, att, "head_scores backward");
  const int64_t N = x.size(0), A = att.size(0), H = x.size(1), C = x.size(2);
  TORCH_CHECK_VALUE(grad_score.sizes() == at::IntArrayRef({A, N, H}) && grad_score.is_contiguous() &&
                        grad_score.scalar_type() == att.scalar_type(),
                    text("head_scores backward: grad_score must be contiguous [", A, ", ", N, ", ", H,
                         "] of att's dtype, got ", sizes_text(grad_score.sizes()), " ",
                         dtype_text(grad_score.scalar_type())));
  check_same_device(x, "x", grad_score, "grad_score");
  HeadScoresBackwardParams p;
  if (grad_x_into.has_value()) {
    const at::Tensor& into = *grad_x_into;
    TORCH_CHECK_VALUE(x_grad && into.sizes() == x.sizes() && into.scalar_type() == x.scalar_type() &&
                          into.is_contiguous(),
                      "head_scores backward: grad_x_into must be x's contiguous [N, H, C] in x's "
                      "dtype, with x_grad");
    check_same_device(x, "x", into, "grad_x_into");
    p.grad_x = into.data_ptr();
    p.grad_x_accumulate = true;
  } else if (x_grad) {
    grad_x = at::empty_like(x);
    p.grad_x = grad_x.data_ptr();
  }
  if (att_grad) {
    att_partials = at::empty({head_score_chunks(N), A, H * C}, att.options());
    p.att_partials = att_partials.data_ptr();
  }
  p.x = x.data_ptr();
  p.att = att.data_ptr();
  p.grad_score = grad_score.data_ptr();
  p.scalar_type = scalar_type_of(x, "head_scores: x");
  p.num_rows = N;
  p.num_att = A;
  p.heads = H;
  p.channels = C;
  return p;
}

// The backward op's outputs: d x, and d att = the chunks' partials added by one reduction over
// the chunk axis (a fixed order, the same on every run); an empty tensor for a gradient not
// asked for.
inline std::tuple<at::Tensor, at::Tensor> head_scores_grads(const at::Tensor& x, const at::Tensor& att,
                                                            const at::Tensor& grad_x,
                                                            const at::Tensor& att_partials) {
  return {grad_x.defined() ? grad_x : at::empty({0}, x.options()),
          att_partials.defined() ? att_partials.sum(0).view(att.sizes()) : at::empty({0}, att.options())};
}

}  // namespace gnnio::binding
