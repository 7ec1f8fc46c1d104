// Autograd of gnnio::wsb_spmm, in C++ like the CSR spmm's. out = A x over WSB tiles =>
// dx = Aᵀ dout over the cached transposed WSB (the same tensor-core kernel, no atomics), and
// d values = wsb_sddmm(dout, x), the dense gradient of each stored tile (the gradient of an edge
// weight is that at the edge's slot: gnnio.Graph scatters weights into tiles with index_put,
// whose own backward is that gather).
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include "common.h"

namespace gnnio::binding {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using OptTensor = c10::optional<at::Tensor>;

at::Tensor call_wsb_spmm(const at::Tensor& block_rowptr, const at::Tensor& block_col,
                         const at::Tensor& values, const at::Tensor& x, int64_t num_rows,
                         int64_t num_cols, const at::Tensor& block_rowptr_t,
                         const at::Tensor& block_col_t, const OptTensor& values_t) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("gnnio::wsb_spmm", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&, int64_t, int64_t, const at::Tensor&,
                                         const at::Tensor&, const OptTensor&)>();
  return op.call(block_rowptr, block_col, values, x, num_rows, num_cols, block_rowptr_t,
                 block_col_t, values_t);
}

at::Tensor call_wsb_sddmm(const at::Tensor& block_rowptr, const at::Tensor& block_col,
                          const at::Tensor& a, const at::Tensor& b) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("gnnio::wsb_sddmm", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const at::Tensor&)>();
  return op.call(block_rowptr, block_col, a, b);
}

class WsbSpmmFunction : public torch::autograd::Function<WsbSpmmFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& block_rowptr,
                            const at::Tensor& block_col, const at::Tensor& values,
                            const at::Tensor& x, int64_t num_rows, int64_t num_cols,
                            const at::Tensor& block_rowptr_t, const at::Tensor& block_col_t,
                            const OptTensor& values_t, bool x_grad, bool values_grad) {
    at::AutoDispatchBelowADInplaceOrView guard;
    auto out = call_wsb_spmm(block_rowptr, block_col, values, x, num_rows, num_cols,
                             block_rowptr_t, block_col_t, values_t);
    ctx->save_for_backward({block_rowptr, block_col, values, values_grad ? x : at::Tensor(),
                            x_grad ? block_rowptr_t : at::Tensor(),
                            x_grad ? block_col_t : at::Tensor(),
                            x_grad ? *values_t : at::Tensor()});
    ctx->saved_data["num_rows"] = num_rows;
    ctx->saved_data["num_cols"] = num_cols;
    ctx->saved_data["x_grad"] = x_grad;
    ctx->saved_data["values_grad"] = values_grad;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &block_rowptr = saved[0], &block_col = saved[1], &values = saved[2];
    const at::Tensor &x = saved[3], &block_rowptr_t = saved[4], &block_col_t = saved[5],
                     &values_t = saved[6];
    const int64_t num_rows = ctx->saved_data["num_rows"].toInt();
    const int64_t num_cols = ctx->saved_data["num_cols"].toInt();
    const at::Tensor grad_out = grads[0].contiguous();
    at::Tensor grad_x, grad_values;
    if (ctx->saved_data["x_grad"].toBool()) {
      // Through the dispatcher with autograd, so a double backward works too.
      grad_x = call_wsb_spmm(block_rowptr_t, block_col_t, values_t, grad_out, num_cols, num_rows,
                             block_rowptr, block_col, values);
    }
    if (ctx->saved_data["values_grad"].toBool())
      grad_values = call_wsb_sddmm(block_rowptr, block_col, grad_out, x.contiguous());
    return {at::Tensor(), at::Tensor(), grad_values, grad_x, at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor wsb_spmm_autograd(const at::Tensor& block_rowptr, const at::Tensor& block_col,
                             const at::Tensor& values, const at::Tensor& x, int64_t num_rows,
                             int64_t num_cols, const at::Tensor& block_rowptr_t,
                             const at::Tensor& block_col_t, const OptTensor& values_t) {
  // Decided here: Function::apply runs forward() with grad mode off.
  const bool grad_mode = at::GradMode::is_enabled();
  const bool x_grad = grad_mode && x.requires_grad();
  const bool values_grad = grad_mode && values.requires_grad();
  TORCH_CHECK_VALUE(!x_grad || values_t.has_value(),
                    "wsb_spmm: x requires grad, so the transposed WSB (block_rowptr_t, "
                    "block_col_t, values_t) must be given");
  return WsbSpmmFunction::apply(block_rowptr, block_col, values, x, num_rows, num_cols,
                                block_rowptr_t, block_col_t, values_t, x_grad, values_grad);
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, Autograd, m) {
  m.impl("wsb_spmm", &wsb_spmm_autograd);
  // The tile gradient is only ever a gradient; differentiating it again raises.
  m.impl("wsb_sddmm", torch::autograd::autogradNotImplementedFallback());
}

}  // namespace gnnio::binding
