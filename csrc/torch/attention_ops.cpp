// CPU implementations of the attention family.
#include "attention_common.h"

namespace gnnio::binding {
namespace {

std::tuple<at::Tensor, at::Tensor> gat_cpu_impl(const at::Tensor& rowptr, const at::Tensor& col,
                                                const at::Tensor& alpha_src,
                                                const c10::optional<at::Tensor>& alpha_dst,
                                                const at::Tensor& h_src, int64_t num_dst,
                                                double negative_slope, const at::Tensor& /*rowptr_t*/,
                                                const at::Tensor& /*col_t*/) {
  GatParams p = gat_params(rowptr, col, alpha_src, alpha_dst, h_src, num_dst, negative_slope);
  auto out = at::empty({num_dst, p.heads, p.channels}, h_src.options());
  auto stats = at::empty({num_dst, p.heads, 2}, h_src.options());
  p.out = out.data_ptr();
  p.stats = stats.data_ptr();
  translate_errors([&] { gat_forward_cpu(p); });
  return {out, stats};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> gat_backward_cpu_impl(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& alpha_src,
    const c10::optional<at::Tensor>& alpha_dst, const at::Tensor& h_src, const at::Tensor& out,
    const at::Tensor& stats, const at::Tensor& rowptr_t, const at::Tensor& col_t,
    const at::Tensor& grad_out, double negative_slope) {
  GatBackwardParams b;
  b.fwd = gat_params(rowptr, col, alpha_src, alpha_dst, h_src, rowptr.numel() - 1, negative_slope);
  check_csr(rowptr_t, col_t, b.fwd.num_src, "gat backward");
  const auto g = grad_out.contiguous();
  TORCH_CHECK_VALUE(g.sizes() == out.sizes() && out.is_contiguous() && stats.is_contiguous() &&
                        stats.dim() == 3 && stats.size(0) == b.fwd.num_dst &&
                        stats.size(1) == b.fwd.heads && stats.size(2) == 2,
                    "gat backward: grad_out, out and stats must match the forward");
  auto grad_h = at::empty_like(h_src);
  auto grad_alpha_src = at::empty_like(alpha_src);
  auto grad_alpha_dst = alpha_dst.has_value() ? at::empty_like(*alpha_dst) : at::empty({0}, h_src.options());
  auto delta = at::empty({b.fwd.num_dst, b.fwd.heads}, h_src.options().dtype(at::kDouble));
  b.fwd.out = const_cast<void*>(out.data_ptr());
  b.fwd.stats = const_cast<void*>(stats.data_ptr());
  b.rowptr_t = rowptr_t.data_ptr();
  b.col_t = col_t.data_ptr();
  b.grad_out = g.data_ptr();
  b.grad_h_src = grad_h.data_ptr();
  b.grad_alpha_src = grad_alpha_src.data_ptr();
  b.grad_alpha_dst = alpha_dst.has_value() ? grad_alpha_dst.data_ptr() : nullptr;
  b.delta = delta.data_ptr();
  translate_errors([&] { gat_backward_cpu(b); });
  return {grad_h, grad_alpha_src, grad_alpha_dst};
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, CPU, m) {
  m.impl("gat", &gat_cpu_impl);
  m.impl("gat_backward", &gat_backward_cpu_impl);
}

}  // namespace gnnio::binding
