// CPU implementations of the SpMM family.
#include "spmm_common.h"

namespace gnnio::binding {
namespace {

at::Tensor spmm_cpu_impl(const at::Tensor& rowptr, const at::Tensor& col,
                         const c10::optional<at::Tensor>& value, const at::Tensor& x,
                         int64_t num_rows, int64_t num_cols, int64_t /*cache_key*/,
                         const at::Tensor& /*rowptr_t*/, const at::Tensor& /*col_t*/,
                         const c10::optional<at::Tensor>& /*value_t*/, int64_t /*cache_key_t*/) {
  check_csr(rowptr, col, num_rows, "spmm");  // num_rows >= 0 before the allocation
  auto out = at::empty({num_rows, x.dim() == 2 ? x.size(1) : 0}, x.options());
  const SpmmParams p = spmm_params(rowptr, col, value, x, num_rows, num_cols, out);
  translate_errors([&] { spmm_cpu(p); });
  return out;
}

at::Tensor sddmm_cpu_impl(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& a,
                          const at::Tensor& b) {
  auto out = at::empty({col.numel()}, a.options());
  const SddmmParams p = sddmm_params(rowptr, col, a, b, out);
  translate_errors([&] { sddmm_cpu(p); });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, CPU, m) {
  m.impl("spmm", &spmm_cpu_impl);
  m.impl("sddmm", &sddmm_cpu_impl);
}

}  // namespace gnnio::binding
