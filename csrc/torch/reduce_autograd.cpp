// Autograd of gnnio::segment_reduce (max / min): the gradient goes to the winning slot of each
// (row, feature), gathered over the cached transpose (segment_reduce_backward, no atomics).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

namespace gnnio::binding {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

std::tuple<at::Tensor, at::Tensor> call_forward(const at::Tensor& rowptr, const at::Tensor& col,
                                                const at::Tensor& x, int64_t num_rows,
                                                int64_t num_cols, c10::string_view reduce,
                                                const at::Tensor& rowptr_t, const at::Tensor& col_t,
                                                const at::Tensor& t2c,
                                                const c10::optional<at::Tensor>& heavy_rows,
                                                const c10::optional<at::Tensor>& heavy_items,
                                                int64_t light_max_degree) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("gnnio::segment_reduce", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t,
                           c10::string_view, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const c10::optional<at::Tensor>&, const c10::optional<at::Tensor>&,
                           int64_t)>();
  return op.call(rowptr, col, x, num_rows, num_cols, reduce, rowptr_t, col_t, t2c, heavy_rows,
                 heavy_items, light_max_degree);
}

at::Tensor call_backward(const at::Tensor& rowptr_t, const at::Tensor& col_t, const at::Tensor& t2c,
                         const at::Tensor& arg, const at::Tensor& grad_out, int64_t num_src) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("gnnio::segment_reduce_backward", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, const at::Tensor&, int64_t)>();
  return op.call(rowptr_t, col_t, t2c, arg, grad_out, num_src);
}

class SegmentReduceFunction : public torch::autograd::Function<SegmentReduceFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& rowptr,
                               const at::Tensor& col, const at::Tensor& x, int64_t num_rows,
                               int64_t num_cols, c10::string_view reduce,
                               const at::Tensor& rowptr_t, const at::Tensor& col_t,
                               const at::Tensor& t2c, const c10::optional<at::Tensor>& heavy_rows,
                               const c10::optional<at::Tensor>& heavy_items,
                               int64_t light_max_degree, bool x_grad) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, arg] = call_forward(rowptr, col, x, num_rows, num_cols, reduce, rowptr_t, col_t, t2c,
                                   heavy_rows, heavy_items, light_max_degree);
    ctx->mark_non_differentiable({arg});
    if (x_grad) ctx->save_for_backward({rowptr_t, col_t, t2c, arg});
    ctx->saved_data["num_cols"] = num_cols;
    ctx->saved_data["x_grad"] = x_grad;
    return {out, arg};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor grad_x;
    if (ctx->saved_data["x_grad"].toBool() && grads[0].defined()) {
      const auto saved = ctx->get_saved_variables();
      grad_x = call_backward(saved[0], saved[1], saved[2], saved[3], grads[0].contiguous(),
                             ctx->saved_data["num_cols"].toInt());
    }
    return {at::Tensor(), at::Tensor(), grad_x, at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> segment_reduce_autograd(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& x, int64_t num_rows,
    int64_t num_cols, c10::string_view reduce, const at::Tensor& rowptr_t, const at::Tensor& col_t,
    const at::Tensor& t2c, const c10::optional<at::Tensor>& heavy_rows,
    const c10::optional<at::Tensor>& heavy_items, int64_t light_max_degree) {
  const bool x_grad = at::GradMode::is_enabled() && x.requires_grad();
  auto outs = SegmentReduceFunction::apply(rowptr, col, x, num_rows, num_cols, reduce, rowptr_t,
                                           col_t, t2c, heavy_rows, heavy_items, light_max_degree,
                                           x_grad);
  return {outs[0], outs[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, Autograd, m) {
  m.impl("segment_reduce", &segment_reduce_autograd);
  m.impl("segment_reduce_backward", torch::autograd::autogradNotImplementedFallback());
}

}  // namespace gnnio::binding
