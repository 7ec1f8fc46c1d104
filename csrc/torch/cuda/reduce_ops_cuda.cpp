// CUDA implementations of the reduction family.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../reduce_common.h"

namespace gnnio::binding {
namespace {

using OptTensor = c10::optional<at::Tensor>;

at::Tensor workspace(size_t bytes, const at::Tensor& like) {
  return at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
}

std::tuple<at::Tensor, at::Tensor> segment_reduce_cuda_impl(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& x, int64_t num_rows,
    int64_t num_cols, c10::string_view reduce, const at::Tensor& /*rowptr_t*/,
    const at::Tensor& /*col_t*/, const at::Tensor& /*t2c*/, const OptTensor& heavy_rows,
    const OptTensor& heavy_items, int64_t light_max_degree, const OptTensor& /*heavy_src*/,
    const OptTensor& /*heavy_src_items*/, int64_t /*light_max_out_degree*/, const OptTensor& weight) {
  const c10::cuda::CUDAGuard guard(x.device());
  check_csr(rowptr, col, num_rows, "segment_reduce");  // num_rows >= 0 before the allocation
  const at::Tensor xs = x.dim() == 2 && x.size(1) > 1 && x.stride(1) != 1 ? x.contiguous() : x;
  const int64_t width = xs.dim() == 2 ? xs.size(1) : 0;
  auto out = at::empty({num_rows, width}, xs.options());
  auto arg = at::empty({num_rows, width}, rowptr.options());
  auto p = segment_reduce_params(rowptr, col, xs, num_rows, num_cols, reduce, weight, out, arg);
  p.split = row_split_of(heavy_rows, heavy_items, light_max_degree, xs, "segment_reduce");
  translate_errors([&] {
    auto ws = workspace(segment_reduce_cuda_workspace_bytes(p), xs);
    segment_reduce_cuda(p, ws.data_ptr(), at::cuda::getCurrentCUDAStream().stream());
  });
  return {out, arg};
}

at::Tensor segment_reduce_backward_cuda_impl(const at::Tensor& rowptr_t, const at::Tensor& col_t,
                                             const at::Tensor& t2c, const at::Tensor& arg,
                                             const at::Tensor& grad_out, int64_t num_src,
                                             const OptTensor& heavy_src, const OptTensor& heavy_src_items,
                                             int64_t light_max_out_degree, const OptTensor& weight) {
  const c10::cuda::CUDAGuard guard(grad_out.device());
  check_csr(rowptr_t, col_t, num_src, "segment_reduce backward");
  TORCH_CHECK_VALUE(grad_out.dim() == 2, text("segment_reduce backward: grad_out must be 2-D, got ",
                                              sizes_text(grad_out.sizes())));
  auto grad_x = at::empty({num_src, grad_out.size(1)}, grad_out.options());
  const auto g = grad_out.contiguous();
  auto p = segment_reduce_backward_params(rowptr_t, col_t, t2c, arg, g, num_src, weight, grad_x);
  p.split = row_split_of(heavy_src, heavy_src_items, light_max_out_degree, g,
                         "segment_reduce backward");
  translate_errors([&] {
    auto ws = workspace(segment_reduce_backward_cuda_workspace_bytes(p), g);
    segment_reduce_backward_cuda(p, ws.data_ptr(), at::cuda::getCurrentCUDAStream().stream());
  });
  return grad_x;
}

at::Tensor segment_reduce_weight_backward_cuda_impl(const at::Tensor& col, const at::Tensor& x,
                                                    const at::Tensor& arg, const at::Tensor& grad_out) {
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xs = x.dim() == 2 && x.size(1) > 1 && x.stride(1) != 1 ? x.contiguous() : x;
  auto grad_weight = at::zeros({col.numel()}, xs.options().dtype(weight_grad_acc_dtype(xs)));
  const auto g = grad_out.contiguous();
  const auto p = segment_reduce_weight_grad_params(col, xs, arg, g, grad_weight);
  translate_errors([&] {
    segment_reduce_weight_grad_cuda(p, at::cuda::getCurrentCUDAStream().stream());
  });
  return grad_weight.to(xs.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) {
  m.impl("segment_reduce", &segment_reduce_cuda_impl);
  m.impl("segment_reduce_backward", &segment_reduce_backward_cuda_impl);
  m.impl("segment_reduce_weight_backward", &segment_reduce_weight_backward_cuda_impl);
}

}  // namespace gnnio::binding
