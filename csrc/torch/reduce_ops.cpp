// CPU implementations of the reduction family.
#include "reduce_common.h"

namespace gnnio::binding {
namespace {

std::tuple<at::Tensor, at::Tensor> segment_reduce_cpu_impl(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& x, int64_t num_rows,
    int64_t num_cols, c10::string_view reduce, const at::Tensor& /*rowptr_t*/,
    const at::Tensor& /*col_t*/, const at::Tensor& /*t2c*/,
    const c10::optional<at::Tensor>& /*heavy_rows*/, const c10::optional<at::Tensor>& /*heavy_items*/,
    int64_t /*light_max_degree*/, const c10::optional<at::Tensor>& /*heavy_src*/,
    const c10::optional<at::Tensor>& /*heavy_src_items*/, int64_t /*light_max_out_degree*/,
    const c10::optional<at::Tensor>& weight) {
  check_csr(rowptr, col, num_rows, "segment_reduce");  // num_rows >= 0 before the allocation
  const int64_t width = x.dim() == 2 ? x.size(1) : 0;
  auto out = at::empty({num_rows, width}, x.options());
  auto arg = at::empty({num_rows, width}, rowptr.options());
  const auto p = segment_reduce_params(rowptr, col, x, num_rows, num_cols, reduce, weight, out, arg);
  translate_errors([&] { segment_reduce_cpu(p); });
  return {out, arg};
}

at::Tensor segment_reduce_backward_cpu_impl(const at::Tensor& rowptr_t, const at::Tensor& col_t,
                                            const at::Tensor& t2c, const at::Tensor& arg,
                                            const at::Tensor& grad_out, int64_t num_src,
                                            const c10::optional<at::Tensor>& /*heavy_src*/,
                                            const c10::optional<at::Tensor>& /*heavy_src_items*/,
                                            int64_t /*light_max_out_degree*/,
                                            const c10::optional<at::Tensor>& weight) {
  check_csr(rowptr_t, col_t, num_src, "segment_reduce backward");
  TORCH_CHECK_VALUE(grad_out.dim() == 2, text("segment_reduce backward: grad_out must be 2-D, got ",
                                              sizes_text(grad_out.sizes())));
  auto grad_x = at::empty({num_src, grad_out.size(1)}, grad_out.options());
  const auto g = grad_out.contiguous();
  const auto p = segment_reduce_backward_params(rowptr_t, col_t, t2c, arg, g, num_src, weight, grad_x);
  translate_errors([&] { segment_reduce_backward_cpu(p); });
  return grad_x;
}

at::Tensor segment_reduce_weight_backward_cpu_impl(const at::Tensor& col, const at::Tensor& x,
                                                   const at::Tensor& arg, const at::Tensor& grad_out) {
  auto grad_weight = at::zeros({col.numel()}, x.options().dtype(weight_grad_acc_dtype(x)));
  const auto g = grad_out.contiguous();
  const auto p = segment_reduce_weight_grad_params(col, x, arg, g, grad_weight);
  translate_errors([&] { segment_reduce_weight_grad_cpu(p); });
  return grad_weight.to(x.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, CPU, m) {
  m.impl("segment_reduce", &segment_reduce_cpu_impl);
  m.impl("segment_reduce_backward", &segment_reduce_backward_cpu_impl);
  m.impl("segment_reduce_weight_backward", &segment_reduce_weight_backward_cpu_impl);
}

}  // namespace gnnio::binding
