// CUDA implementations of the WSB family. The format is built with ATen ops (one sort by
// (block row, block column) key, as torch.unique does it); it is built once per Graph, so a
// plain correct build is enough, and it gives the tiles in the CPU build's order exactly.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../graph_common.h"
#include "../wsb_common.h"

namespace gnnio::binding {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> wsb_from_coo_cuda(const at::Tensor& row,
                                                                 const at::Tensor& col,
                                                                 int64_t num_rows,
                                                                 int64_t num_cols) {
  const c10::cuda::CUDAGuard guard(row.device());
  check_wsb_build(row, col, num_rows, num_cols);
  check_id_range(row, num_rows, "row");
  check_id_range(col, num_cols, "column");
  const int64_t block_rows = wsb_blocks(num_rows);
  const int64_t block_cols = std::max<int64_t>(wsb_blocks(num_cols), 1);
  TORCH_CHECK_VALUE(block_rows <= (int64_t(1) << 62) / block_cols,
                    text("wsb_from_coo: ", num_rows, " x ", num_cols, " has too many tiles to index"));
  const auto r = row.to(at::kLong), c = col.to(at::kLong);
  // Tile key of each edge, in the order tiles are stored: block row major, block column minor.
  const auto key = at::bitwise_right_shift(r, 4) * block_cols + at::bitwise_right_shift(c, 4);
  const auto [tiles, tile_of_edge, counts] =
      at::_unique2(key, /*sorted=*/true, /*return_inverse=*/true, /*return_counts=*/false);
  const auto tile_row = at::div(tiles, block_cols, "floor");
  auto block_col = at::remainder(tiles, block_cols).to(row.scalar_type()).contiguous();
  auto block_rowptr = at::searchsorted(tile_row, at::arange(block_rows + 1, r.options()))
                          .to(row.scalar_type())
                          .contiguous();
  auto pos = (tile_of_edge * kWsbTileSize + at::bitwise_and(r, kWsbTile - 1) * kWsbTile +
              at::bitwise_and(c, kWsbTile - 1))
                 .contiguous();
  return {block_rowptr, block_col, pos};
}

at::Tensor wsb_spmm_cuda_impl(const at::Tensor& block_rowptr, const at::Tensor& block_col,
                              const at::Tensor& values, const at::Tensor& x, int64_t num_rows,
                              int64_t num_cols, const at::Tensor& /*block_rowptr_t*/,
                              const at::Tensor& /*block_col_t*/,
                              const c10::optional<at::Tensor>& /*values_t*/) {
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xs = x.dim() == 2 && x.size(1) > 1 && x.stride(1) != 1 ? x.contiguous() : x;
  auto out = at::empty({num_rows, xs.dim() == 2 ? xs.size(1) : 0}, xs.options());
  const WsbSpmmParams p = wsb_spmm_params(block_rowptr, block_col, values, xs, num_rows, num_cols, out);
  translate_errors([&] { wsb_spmm_cuda(p, at::cuda::getCurrentCUDAStream().stream()); });
  return out;
}

at::Tensor wsb_sddmm_cuda_impl(const at::Tensor& block_rowptr, const at::Tensor& block_col,
                               const at::Tensor& a, const at::Tensor& b) {
  const c10::cuda::CUDAGuard guard(a.device());
  auto out = at::empty({block_col.numel(), kWsbTile, kWsbTile}, a.options());
  const WsbSddmmParams p = wsb_sddmm_params(block_rowptr, block_col, a, b, out);
  translate_errors([&] { wsb_sddmm_cuda(p, at::cuda::getCurrentCUDAStream().stream()); });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) {
  m.impl("wsb_from_coo", &wsb_from_coo_cuda);
  m.impl("wsb_spmm", &wsb_spmm_cuda_impl);
  m.impl("wsb_sddmm", &wsb_sddmm_cuda_impl);
}

}  // namespace gnnio::binding
