// Autograd of gnnio::segment_reduce (max / min): the gradient goes to the winning slot of each
// (row, feature), gathered over the cached transpose (segment_reduce_backward, no atomics); a
// weighted reduction's weights get theirs from segment_reduce_weight_backward.
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
    int64_t light_max_out_degree, const OptTensor& weight) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("gnnio::segment_reduce", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t,
                           c10::string_view, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const OptTensor&, const OptTensor&, int64_t, const OptTensor&,
                           const OptTensor&, int64_t, const OptTensor&)>();
  return op.call(rowptr, col, x, num_rows, num_cols, reduce, rowptr_t, col_t, t2c, heavy_rows,
                 heavy_items, light_max_degree, heavy_src, heavy_src_items, light_max_out_degree,
                 weight);
}

at::Tensor call_backward(const at::Tensor& rowptr_t, const at::Tensor& col_t, const at::Tensor& t2c,
                         const at::Tensor& arg, const at::Tensor& grad_out, int64_t num_src,
                         const OptTensor& heavy_src, const OptTensor& heavy_src_items,
                         int64_t light_max_out_degree, const OptTensor& weight) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("gnnio::segment_reduce_backward", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, const at::Tensor&, int64_t,
                                         const OptTensor&, const OptTensor&, int64_t,
                                         const OptTensor&)>();
  return op.call(rowptr_t, col_t, t2c, arg, grad_out, num_src, heavy_src, heavy_src_items,
                 light_max_out_degree, weight);
}

at::Tensor call_weight_backward(const at::Tensor& col, const at::Tensor& x, const at::Tensor& arg,
                                const at::Tensor& grad_out) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("gnnio::segment_reduce_weight_backward", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&)>();
  return op.call(col, x, arg, grad_out);
}

OptTensor optional(const at::Tensor& t) { return t.defined() ? OptTensor(t) : c10::nullopt; }

// Saved tensors, by position.
enum Saved { kRowptrT, kColT, kT2c, kArg, kHeavySrc, kHeavySrcItems, kWeight, kCol, kX, kNumSaved };

class SegmentReduceFunction : public torch::autograd::Function<SegmentReduceFunction> {
 public:
  static constexpr int kXInput = 2, kWeightInput = 15, kNumInputs = 18;

  static variable_list forward(AutogradContext* ctx, const at::Tensor& rowptr,
                               const at::Tensor& col, const at::Tensor& x, int64_t num_rows,
                               int64_t num_cols, c10::string_view reduce,
                               const at::Tensor& rowptr_t, const at::Tensor& col_t,
                               const at::Tensor& t2c, const OptTensor& heavy_rows,
                               const OptTensor& heavy_items, int64_t light_max_degree,
                               const OptTensor& heavy_src, const OptTensor& heavy_src_items,
                               int64_t light_max_out_degree, const OptTensor& weight, bool x_grad,
                               bool weight_grad) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto [out, arg] = call_forward(rowptr, col, x, num_rows, num_cols, reduce, rowptr_t, col_t, t2c,
                                   heavy_rows, heavy_items, light_max_degree, heavy_src,
                                   heavy_src_items, light_max_out_degree, weight);
    ctx->mark_non_differentiable({arg});
    if (x_grad || weight_grad) {
      // x's gradient reads the transpose and the weights; the weights' gradient reads x.
      std::vector<at::Tensor> saved(kNumSaved);
      saved[kArg] = arg;
      if (x_grad) {
        saved[kRowptrT] = rowptr_t, saved[kColT] = col_t, saved[kT2c] = t2c;
        if (heavy_src.has_value() && heavy_src_items.has_value())
          saved[kHeavySrc] = *heavy_src, saved[kHeavySrcItems] = *heavy_src_items;
        if (weight.has_value()) saved[kWeight] = *weight;
      }
      if (weight_grad) saved[kCol] = col, saved[kX] = x;
      ctx->save_for_backward(saved);
    }
    ctx->saved_data["num_cols"] = num_cols;
    ctx->saved_data["x_grad"] = x_grad;
    ctx->saved_data["weight_grad"] = weight_grad;
    ctx->saved_data["light_max_out_degree"] = light_max_out_degree;
    return {out, arg};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list grads_in(kNumInputs);
    const bool x_grad = ctx->saved_data["x_grad"].toBool();
    const bool weight_grad = ctx->saved_data["weight_grad"].toBool();
    if (!grads[0].defined() || !(x_grad || weight_grad)) return grads_in;
    const auto saved = ctx->get_saved_variables();
    const at::Tensor g = grads[0].contiguous();
    if (x_grad)
      grads_in[kXInput] = call_backward(
          saved[kRowptrT], saved[kColT], saved[kT2c], saved[kArg], g,
          ctx->saved_data["num_cols"].toInt(), optional(saved[kHeavySrc]),
          optional(saved[kHeavySrcItems]), ctx->saved_data["light_max_out_degree"].toInt(),
          // The weights in transposed slot order: one gather here, read in order by the kernel.
          saved[kWeight].defined() ? OptTensor(saved[kWeight].index_select(0, saved[kT2c]))
                                   : c10::nullopt);
    if (weight_grad) grads_in[kWeightInput] = call_weight_backward(saved[kCol], saved[kX], saved[kArg], g);
    return grads_in;
  }
};

std::tuple<at::Tensor, at::Tensor> segment_reduce_autograd(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& x, int64_t num_rows,
    int64_t num_cols, c10::string_view reduce, const at::Tensor& rowptr_t, const at::Tensor& col_t,
    const at::Tensor& t2c, const OptTensor& heavy_rows, const OptTensor& heavy_items,
    int64_t light_max_degree, const OptTensor& heavy_src, const OptTensor& heavy_src_items,
    int64_t light_max_out_degree, const OptTensor& weight) {
  const bool grad_mode = at::GradMode::is_enabled();
  const bool x_grad = grad_mode && x.requires_grad();
  const bool weight_grad = grad_mode && weight.has_value() && weight->requires_grad();
  auto outs = SegmentReduceFunction::apply(rowptr, col, x, num_rows, num_cols, reduce, rowptr_t,
                                           col_t, t2c, heavy_rows, heavy_items, light_max_degree,
                                           heavy_src, heavy_src_items, light_max_out_degree, weight,
                                           x_grad, weight_grad);
  return {outs[0], outs[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, Autograd, m) {
  m.impl("segment_reduce", &segment_reduce_autograd);
  m.impl("segment_reduce_backward", torch::autograd::autogradNotImplementedFallback());
  m.impl("segment_reduce_weight_backward", torch::autograd::autogradNotImplementedFallback());
}

}  // namespace gnnio::binding
