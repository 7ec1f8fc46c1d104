// CPU implementations of the WSB family: the format build (gnnio core) and the tiled SpMM.
#include "wsb_common.h"

namespace gnnio::binding {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> wsb_from_coo_cpu(const at::Tensor& row,
                                                                const at::Tensor& col,
                                                                int64_t num_rows,
                                                                int64_t num_cols) {
  WsbBuildParams p;
  p.index_type = check_wsb_build(row, col, num_rows, num_cols);
  const auto r = row.contiguous(), c = col.contiguous();
  auto block_rowptr = at::empty({wsb_blocks(num_rows) + 1}, r.options());
  auto pos = at::empty({r.numel()}, r.options().dtype(at::kLong));
  p.row = r.data_ptr();
  p.col = c.data_ptr();
  p.num_edges = r.numel();
  p.num_rows = num_rows;
  p.num_cols = num_cols;
  p.block_rowptr = block_rowptr.data_ptr();
  p.pos = pos.data_ptr<int64_t>();
  const int64_t tiles = translate_errors([&] { return wsb_count_tiles_cpu(p); });
  auto block_col = at::empty({tiles}, r.options());
  p.block_col = block_col.data_ptr();
  translate_errors([&] { wsb_fill_cpu(p); });
  return {block_rowptr, block_col, pos};
}

at::Tensor wsb_spmm_cpu_impl(const at::Tensor& block_rowptr, const at::Tensor& block_col,
                             const at::Tensor& values, const at::Tensor& x, int64_t num_rows,
                             int64_t num_cols, const at::Tensor& /*block_rowptr_t*/,
                             const at::Tensor& /*block_col_t*/,
                             const c10::optional<at::Tensor>& /*values_t*/) {
  auto out = at::empty({num_rows, x.dim() == 2 ? x.size(1) : 0}, x.options());
  const WsbSpmmParams p = wsb_spmm_params(block_rowptr, block_col, values, x, num_rows, num_cols, out);
  translate_errors([&] { wsb_spmm_cpu(p); });
  return out;
}

at::Tensor wsb_sddmm_cpu_impl(const at::Tensor& block_rowptr, const at::Tensor& block_col,
                              const at::Tensor& a, const at::Tensor& b) {
  auto out = at::empty({block_col.numel(), kWsbTile, kWsbTile}, a.options());
  const WsbSddmmParams p = wsb_sddmm_params(block_rowptr, block_col, a, b, out);
  translate_errors([&] { wsb_sddmm_cpu(p); });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, CPU, m) {
  m.impl("wsb_from_coo", &wsb_from_coo_cpu);
  m.impl("wsb_spmm", &wsb_spmm_cpu_impl);
  m.impl("wsb_sddmm", &wsb_sddmm_cpu_impl);
}

}  // namespace gnnio::binding
