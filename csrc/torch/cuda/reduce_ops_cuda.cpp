// CUDA implementations of the reduction family.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../reduce_common.h"

namespace gnnio::binding {
namespace {

std::tuple<at::Tensor, at::Tensor> segment_reduce_cuda_impl(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& x, int64_t num_rows,
    int64_t num_cols, c10::string_view reduce, const at::Tensor& /*rowptr_t*/,
    const at::Tensor& /*col_t*/, const at::Tensor& /*t2c*/,
    const c10::optional<at::Tensor>& heavy_rows, const c10::optional<at::Tensor>& heavy_items,
    int64_t light_max_degree) {
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xs = x.dim() == 2 && x.size(1) > 1 && x.stride(1) != 1 ? x.contiguous() : x;
  const int64_t width = xs.dim() == 2 ? xs.size(1) : 0;
  auto out = at::empty({num_rows, width}, xs.options());
  auto arg = at::empty({num_rows, width}, rowptr.options());
  auto p = segment_reduce_params(rowptr, col, xs, num_rows, num_cols, reduce, out, arg);
  if (heavy_rows.has_value() && heavy_items.has_value() && heavy_rows->numel() > 0) {
    TORCH_CHECK_VALUE(heavy_rows->scalar_type() == at::kLong && heavy_items->scalar_type() == at::kLong &&
                          heavy_items->dim() == 2 && heavy_items->size(1) == 3 &&
                          heavy_rows->is_contiguous() && heavy_items->is_contiguous(),
                      "segment_reduce: heavy_rows must be int64 [H] and heavy_items int64 [I, 3]");
    check_same_device(*heavy_rows, "heavy_rows", xs, "x");
    check_same_device(*heavy_items, "heavy_items", xs, "x");
    p.heavy_rows = heavy_rows->data_ptr<int64_t>();
    p.heavy_items = heavy_items->data_ptr<int64_t>();
    p.num_heavy = heavy_rows->numel();
    p.num_items = heavy_items->size(0);
    p.light_max_degree = light_max_degree;
  }
  translate_errors([&] {
    const size_t bytes = segment_reduce_cuda_workspace_bytes(p);
    auto workspace = at::empty({static_cast<int64_t>(bytes)}, xs.options().dtype(at::kByte));
    segment_reduce_cuda(p, workspace.data_ptr(), at::cuda::getCurrentCUDAStream().stream());
  });
  return {out, arg};
}

at::Tensor segment_reduce_backward_cuda_impl(const at::Tensor& rowptr_t, const at::Tensor& col_t,
                                             const at::Tensor& t2c, const at::Tensor& arg,
                                             const at::Tensor& grad_out, int64_t num_src) {
  const c10::cuda::CUDAGuard guard(grad_out.device());
  auto grad_x = at::empty({num_src, grad_out.size(1)}, grad_out.options());
  const auto g = grad_out.contiguous();
  const auto p = segment_reduce_backward_params(rowptr_t, col_t, t2c, arg, g, num_src, grad_x);
  translate_errors([&] { segment_reduce_backward_cuda(p, at::cuda::getCurrentCUDAStream().stream()); });
  return grad_x;
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) {
  m.impl("segment_reduce", &segment_reduce_cuda_impl);
  m.impl("segment_reduce_backward", &segment_reduce_backward_cuda_impl);
}

}  // namespace gnnio::binding
