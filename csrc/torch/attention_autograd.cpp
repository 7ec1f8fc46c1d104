// Autograd of gnnio::gat: the forward saves only out and the softmax stats (O(N x H x C), O(N x H));
// gat_backward recomputes the attention weights from them.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

namespace gnnio::binding {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using GatSig = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                  const at::Tensor&, const c10::optional<at::Tensor>&,
                                                  const at::Tensor&, int64_t, double,
                                                  const at::Tensor&, const at::Tensor&);
using GatBackwardSig = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&,
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, double);

c10::optional<at::Tensor> opt(const at::Tensor& t) {
  return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

class GatFunction : public torch::autograd::Function<GatFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& rowptr, const at::Tensor& col,
                               const at::Tensor& alpha_src, const c10::optional<at::Tensor>& alpha_dst,
                               const at::Tensor& h_src, int64_t num_dst, double negative_slope,
                               const at::Tensor& rowptr_t, const at::Tensor& col_t) {
    at::AutoDispatchBelowADInplaceOrView guard;
    static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("gnnio::gat", "").typed<GatSig>();
    auto [out, stats] = op.call(rowptr, col, alpha_src, alpha_dst, h_src, num_dst, negative_slope,
                              rowptr_t, col_t);
    ctx->mark_non_differentiable({stats});
    ctx->save_for_backward({rowptr, col, alpha_src, alpha_dst.has_value() ? *alpha_dst : at::Tensor(),
                            h_src, out, stats, rowptr_t, col_t});
    ctx->saved_data["negative_slope"] = negative_slope;
    return {out, stats};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("gnnio::gat_backward", "")
                         .typed<GatBackwardSig>();
    TORCH_CHECK_VALUE(s[7].numel() > 0, "gat backward needs the transposed CSR (rowptr_t, col_t)");
    auto [grad_h, grad_as, grad_ad] =
        op.call(s[0], s[1], s[2], opt(s[3]), s[4], s[5], s[6], s[7], s[8], grads[0].contiguous(),
                ctx->saved_data["negative_slope"].toDouble());
    return {at::Tensor(), at::Tensor(), grad_as, s[3].defined() ? grad_ad : at::Tensor(), grad_h,
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor> gat_autograd(const at::Tensor& rowptr, const at::Tensor& col,
                                                const at::Tensor& alpha_src,
                                                const c10::optional<at::Tensor>& alpha_dst,
                                                const at::Tensor& h_src, int64_t num_dst,
                                                double negative_slope, const at::Tensor& rowptr_t,
                                                const at::Tensor& col_t) {
  auto outs = GatFunction::apply(rowptr, col, alpha_src, alpha_dst, h_src, num_dst, negative_slope,
                                 rowptr_t, col_t);
  return {outs[0], outs[1]};
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, Autograd, m) {
  m.impl("gat", &gat_autograd);
  m.impl("gat_backward", torch::autograd::autogradNotImplementedFallback());
}

}  // namespace gnnio::binding
