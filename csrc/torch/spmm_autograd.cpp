// Autograd of gnnio::spmm, in C++ so a training step pays no Python dispatch per call.
// out = A x  =>  dx = Aᵀ dout over the cached transpose (never rebuilt), and dA's values are
// SDDMM(dout, x) on A's own pattern. Both gathers are deterministic (no atomics).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

namespace gnnio::binding {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

at::Tensor call_spmm(const at::Tensor& rowptr, const at::Tensor& col,
                     const c10::optional<at::Tensor>& value, const at::Tensor& x, int64_t num_rows,
                     int64_t num_cols, int64_t key, const at::Tensor& rowptr_t,
                     const at::Tensor& col_t, const c10::optional<at::Tensor>& value_t,
                     int64_t key_t) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("gnnio::spmm", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&,
                                         const c10::optional<at::Tensor>&, const at::Tensor&,
                                         int64_t, int64_t, int64_t, const at::Tensor&,
                                         const at::Tensor&, const c10::optional<at::Tensor>&,
                                         int64_t)>();
  return op.call(rowptr, col, value, x, num_rows, num_cols, key, rowptr_t, col_t, value_t, key_t);
}

at::Tensor call_sddmm(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& a,
                      const at::Tensor& b) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("gnnio::sddmm", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&)>();
  return op.call(rowptr, col, a, b);
}

at::Tensor opt(const c10::optional<at::Tensor>& t) { return t.has_value() ? *t : at::Tensor(); }
c10::optional<at::Tensor> opt(const at::Tensor& t) {
  return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

class SpmmFunction : public torch::autograd::Function<SpmmFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& rowptr, const at::Tensor& col,
                            const c10::optional<at::Tensor>& value, const at::Tensor& x,
                            int64_t num_rows, int64_t num_cols, int64_t key,
                            const at::Tensor& rowptr_t, const at::Tensor& col_t,
                            const c10::optional<at::Tensor>& value_t, int64_t key_t,
                            bool x_grad, bool value_grad) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto out = call_spmm(rowptr, col, value, x, num_rows, num_cols, key, rowptr_t, col_t, value_t,
                         key_t);
    ctx->save_for_backward({rowptr, col, opt(value), value_grad ? x : at::Tensor(),
                            x_grad ? rowptr_t : at::Tensor(), x_grad ? col_t : at::Tensor(),
                            x_grad ? opt(value_t) : at::Tensor()});
    ctx->saved_data["num_rows"] = num_rows;
    ctx->saved_data["num_cols"] = num_cols;
    ctx->saved_data["key"] = key;
    ctx->saved_data["key_t"] = key_t;
    ctx->saved_data["x_grad"] = x_grad;
    ctx->saved_data["value_grad"] = value_grad;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &rowptr = saved[0], &col = saved[1], &value = saved[2], &x = saved[3];
    const at::Tensor &rowptr_t = saved[4], &col_t = saved[5], &value_t = saved[6];
    const int64_t num_rows = ctx->saved_data["num_rows"].toInt();
    const int64_t num_cols = ctx->saved_data["num_cols"].toInt();
    const at::Tensor grad_out = grads[0].contiguous();
    at::Tensor grad_x, grad_value;
    if (ctx->saved_data["x_grad"].toBool()) {
      // Through the dispatcher with autograd, so a double backward works too.
      grad_x = call_spmm(rowptr_t, col_t, opt(value_t), grad_out, num_cols, num_rows,
                         ctx->saved_data["key_t"].toInt(), rowptr, col, opt(value),
                         ctx->saved_data["key"].toInt());
    }
    if (ctx->saved_data["value_grad"].toBool()) grad_value = call_sddmm(rowptr, col, grad_out, x.contiguous());
    return {at::Tensor(), at::Tensor(), grad_value, grad_x, at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

at::Tensor spmm_autograd(const at::Tensor& rowptr, const at::Tensor& col,
                         const c10::optional<at::Tensor>& value, const at::Tensor& x,
                         int64_t num_rows, int64_t num_cols, int64_t key, const at::Tensor& rowptr_t,
                         const at::Tensor& col_t, const c10::optional<at::Tensor>& value_t,
                         int64_t key_t) {
  // Decided here: Function::apply runs forward() with grad mode off.
  const bool grad_mode = at::GradMode::is_enabled();
  const bool x_grad = grad_mode && x.requires_grad();
  const bool value_grad = grad_mode && value.has_value() && value->requires_grad();
  return SpmmFunction::apply(rowptr, col, value, x, num_rows, num_cols, key, rowptr_t, col_t,
                             value_t, key_t, x_grad, value_grad);
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, Autograd, m) {
  m.impl("spmm", &spmm_autograd);
  // SDDMM is only ever a gradient; differentiating it again raises instead of going silent.
  m.impl("sddmm", torch::autograd::autogradNotImplementedFallback());
}

}  // namespace gnnio::binding
