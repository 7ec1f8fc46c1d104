// CUDA implementation of gnnio::column_sum (gnnio/dense/column_sum.h).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../column_sum_common.h"

namespace gnnio::binding {
namespace {

at::Tensor column_sum_cuda_impl(const at::Tensor& x_in) {
  const c10::cuda::CUDAGuard guard(x_in.device());
  const at::Tensor x = x_in.contiguous();
  at::Tensor out;
  const auto p = column_sum_params(x, out);
  translate_errors([&] {
    auto ws = at::empty({static_cast<int64_t>(column_sum_cuda_workspace_bytes(p))},
                        x.options().dtype(at::kByte));
    column_sum_cuda(p, ws.data_ptr(), at::cuda::getCurrentCUDAStream().stream());
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) { m.impl("column_sum", &column_sum_cuda_impl); }

}  // namespace gnnio::binding
