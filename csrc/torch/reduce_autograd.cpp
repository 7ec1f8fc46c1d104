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

using OptTensor = c10::optional<at::Tensor>;

std::tuple<at::Tensor, at::Tensor> call_forward(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& x, int64_t num_rows,
    int64_t num_cols, c10::string_view reduce, const at::Tensor& rowptr_t, const at::Tensor& col_t,
    const at::Tensor& t2c, const OptTensor& heavy_rows, const OptTensor& heavy_items,
    int64_t light_max_degree, const OptTensor& heavy_src, const OptTensor& heavy_src_items,
    int64_t light_max_out_degree) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("gnnio::segment_reduce", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t,
                           c10::string_view, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const OptTensor&, const OptTensor&, int64_t, const OptTensor&,
                           const OptTensor&, int64_t)>();
  return op.call(rowptr, col, x, num_rows, num_cols, reduce, rowptr_t, col_t, t2c, heavy_rows,
                 heavy_items, light_max_degree, heavy_src, heavy_src_items, light_max_out_degree);
}

at::Tensor call_backward(const at::Tensor& rowptr_t, const at::Tensor& col_t, const at::Tensor& t2c,
                         const at::Tensor& arg, const at::Tensor& grad_out, int64_t num_src,
                         const OptTensor& heavy_src, const OptTensor& heavy_src_items,
                         int64_t light_max_out_degree) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("gnnio::segment_reduce_backward", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, const at::Tensor&, int64_t,
                                         const OptTensor&, const OptTensor&, int64_t)>();
  return op.call(rowptr_t, col_t, t2c, arg, grad_out, num_src, heavy_src, heavy_src_items,
                 light_max_out_degree);
}

class SegmentReduceFunction : public torch::autograd::Function<SegmentReduceFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& rowptr,
                               const at::Tensor& col, const at::Tensor& x, int64_t num_rows,
                               int64_t num_cols, c10::string_view reduce,
                               const at::Tensor& rowptr_t, const at::Tensor& col_t,
                               const at::Tensor& t2c, const OptTensor& heavy_rows,
                               const OptTensor& heavy_items, int64_t light_max_degree,
                               const OptTensor& heavy_src, const OptTensor& heavy_src_items,
                               int64_t light_max_out_degree, bool x_grad) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, arg] = call_forward(rowptr, col, x, num_rows, num_cols, reduce, rowptr_t, col_t, t2c,
                                   heavy_rows, heavy_items, light_max_degree, heavy_src,
                                   heavy_src_items, light_max_out_degree);
    ctx->mark_non_differentiable({arg});
    if (x_grad) {
      const bool split = heavy_src.has_value() && heavy_src_items.has_value();
      ctx->save_for_backward({rowptr_t, col_t, t2c, arg, split ? *heavy_src : at::Tensor(),
                              split ? *heavy_src_items : at::Tensor()});
    }
    ctx->saved_data["num_cols"] = num_cols;
    ctx->saved_data["x_grad"] = x_grad;
    ctx->saved_data["light_max_out_degree"] = light_max_out_degree;
    return {out, arg};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor grad_x;
    if (ctx->saved_data["x_grad"].toBool() && grads[0].defined()) {
      const auto saved = ctx->get_saved_variables();
      const OptTensor heavy_src = saved[4].defined() ? OptTensor(saved[4]) : c10::nullopt;
      const OptTensor heavy_src_items = saved[5].defined() ? OptTensor(saved[5]) : c10::nullopt;
      grad_x = call_backward(saved[0], saved[1], saved[2], saved[3], grads[0].contiguous(),
                             ctx->saved_data["num_cols"].toInt(), heavy_src, heavy_src_items,
                             ctx->saved_data["light_max_out_degree"].toInt());
    }
    variable_list grads_in(16);
    grads_in[2] = grad_x;
    return grads_in;
  }
};

std::tuple<at::Tensor, at::Tensor> segment_reduce_autograd(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& x, int64_t num_rows,
    int64_t num_cols, c10::string_view reduce, const at::Tensor& rowptr_t, const at::Tensor& col_t,
    const at::Tensor& t2c, const OptTensor& heavy_rows, const OptTensor& heavy_items,
    int64_t light_max_degree, const OptTensor& heavy_src, const OptTensor& heavy_src_items,
    int64_t light_max_out_degree) {
  const bool x_grad = at::GradMode::is_enabled() && x.requires_grad();
  auto outs = SegmentReduceFunction::apply(rowptr, col, x, num_rows, num_cols, reduce, rowptr_t,
                                           col_t, t2c, heavy_rows, heavy_items, light_max_degree,
                                           heavy_src, heavy_src_items, light_max_out_degree, x_grad);
  return {outs[0], outs[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, Autograd, m) {
  m.impl("segment_reduce", &segment_reduce_autograd);
  m.impl("segment_reduce_backward", torch::autograd::autogradNotImplementedFallback());
}

}  // namespace gnnio::binding
