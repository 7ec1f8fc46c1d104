#include <algorithm>

#include "gnnio/common/cpu_dispatch.h"
#include "gnnio/wsb/params.h"

namespace gnnio {
namespace {

// Rows (or columns) of block b that lie inside a matrix of n rows: 16 except in the last block.
inline int64_t rows_in_block(int64_t b, int64_t n) {
  return std::min<int64_t>(kWsbTile, n - b * kWsbTile);
}

template <typename scalar_t, typename index_t>
void spmm(const WsbSpmmParams& p) {
  const auto* block_rowptr = static_cast<const index_t*>(p.block_rowptr);
  const auto* block_col = static_cast<const index_t*>(p.block_col);
  const auto* values = static_cast<const scalar_t*>(p.values);
  const auto* x = static_cast<const scalar_t*>(p.x);
  auto* out = static_cast<scalar_t*>(p.out);
  const int64_t width = p.width;

  // Each block row is owned by one thread, which adds its tiles in order: deterministic.
  // Stored zeros are multiplied like any entry, as on the GPU (so a non-finite x entry spreads
  // through its tile there and here alike).
#pragma omp parallel for schedule(dynamic, 16) if (worth_threads(p.num_tiles * kWsbTileSize * width))
  for (int64_t b = 0; b < wsb_blocks(p.num_rows); ++b) {
    const int64_t rows = rows_in_block(b, p.num_rows);
    for (int64_t r = 0; r < rows; ++r) {
      scalar_t* y = out + (b * kWsbTile + r) * p.out_row_stride;
      std::fill(y, y + width, scalar_t(0));
    }
    for (int64_t t = block_rowptr[b]; t < block_rowptr[b + 1]; ++t) {
      const int64_t c0 = int64_t(block_col[t]);
      const int64_t cols = rows_in_block(c0, p.num_cols);
      const scalar_t* tile = values + t * kWsbTileSize;
      for (int64_t r = 0; r < rows; ++r) {
        scalar_t* y = out + (b * kWsbTile + r) * p.out_row_stride;
        for (int64_t c = 0; c < cols; ++c) {
          const scalar_t v = tile[r * kWsbTile + c];
          const scalar_t* xr = x + (c0 * kWsbTile + c) * p.x_row_stride;
          for (int64_t f = 0; f < width; ++f) y[f] += v * xr[f];
        }
      }
    }
  }
}

template <typename scalar_t, typename index_t>
void sddmm(const WsbSddmmParams& p) {
  const auto* block_rowptr = static_cast<const index_t*>(p.block_rowptr);
  const auto* block_col = static_cast<const index_t*>(p.block_col);
  const auto* a = static_cast<const scalar_t*>(p.a);
  const auto* bm = static_cast<const scalar_t*>(p.b);
  auto* out = static_cast<scalar_t*>(p.out);

#pragma omp parallel for schedule(dynamic, 16) if (worth_threads(p.num_tiles * kWsbTileSize * p.width))
  for (int64_t b = 0; b < wsb_blocks(p.num_rows); ++b) {
    const int64_t rows = rows_in_block(b, p.num_rows);
    for (int64_t t = block_rowptr[b]; t < block_rowptr[b + 1]; ++t) {
      const int64_t c0 = int64_t(block_col[t]);
      const int64_t cols = rows_in_block(c0, p.num_cols);
      scalar_t* tile = out + t * kWsbTileSize;
      std::fill(tile, tile + kWsbTileSize, scalar_t(0));
      for (int64_t r = 0; r < rows; ++r) {
        const scalar_t* ar = a + (b * kWsbTile + r) * p.a_row_stride;
        for (int64_t c = 0; c < cols; ++c) {
          const scalar_t* br = bm + (c0 * kWsbTile + c) * p.b_row_stride;
          // In double, as the CSR SDDMM: the error does not grow with the width.
          double acc = 0;
          for (int64_t f = 0; f < p.width; ++f) acc += double(ar[f]) * double(br[f]);
          tile[r * kWsbTile + c] = static_cast<scalar_t>(acc);
        }
      }
    }
  }
}

}  // namespace

void wsb_spmm_cpu(const WsbSpmmParams& p) {
  dispatch_cpu(p.scalar_type, p.index_type, "wsb_spmm", [&](auto scalar, auto index) {
    spmm<decltype(scalar), decltype(index)>(p);
  });
}

void wsb_sddmm_cpu(const WsbSddmmParams& p) {
  dispatch_cpu(p.scalar_type, p.index_type, "wsb_sddmm", [&](auto scalar, auto index) {
    sddmm<decltype(scalar), decltype(index)>(p);
  });
}

}  // namespace gnnio
