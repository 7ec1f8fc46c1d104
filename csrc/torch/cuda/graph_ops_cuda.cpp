// CUDA implementations of the graph-format ops.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../graph_common.h"

namespace gnnio::binding {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> csr_from_coo_cuda(const at::Tensor& row,
                                                                 const at::Tensor& col,
                                                                 int64_t num_rows,
                                                                 int64_t num_cols) {
  const c10::cuda::CUDAGuard guard(row.device());
  CsrBuildTensors t = prepare_csr_build(row, col, num_rows, num_cols);
  check_id_range(t.row, num_rows, "row");
  check_id_range(t.col, num_cols, "column");
  translate_errors([&] {
    const size_t bytes = csr_build_cuda_workspace_bytes(t.params);
    auto workspace = at::empty({static_cast<int64_t>(bytes)}, t.row.options().dtype(at::kByte));
    csr_build_cuda(t.params, workspace.data_ptr(), bytes, at::cuda::getCurrentCUDAStream().stream());
  });
  return {t.rowptr, t.col_sorted, t.perm};
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) { m.impl("csr_from_coo", &csr_from_coo_cuda); }

}  // namespace gnnio::binding
