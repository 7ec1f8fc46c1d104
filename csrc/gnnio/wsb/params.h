// The weighted block-sparse (WSB) format and the SpMM family on it.
//
// WSB packs a weighted adjacency A (rows = destinations, columns = sources, as csr_by_dst) into
// dense 16 x 16 tiles: block row b holds rows 16b .. 16b+15, block column c columns 16c .. 16c+15,
// and only tiles with at least one edge are stored. A tile is a dense operand of a tensor-core
// MMA, so on a locally dense graph SpMM reads each feature row once per tile instead of once per
// edge; every stored zero costs a multiply, which the fill ratio (stored zeros / stored entries)
// measures. Rows and columns past the matrix in the last block row / column are zeros.
//
// Layout: block_rowptr [num_block_rows + 1] (tiles of block row b are block_rowptr[b] ..
// block_rowptr[b+1]-1), block_col [num_tiles] (increasing within a block row), values
// [num_tiles, 16, 16] row-major (entry (r, c) of a tile in block row b, block column c0 weighs
// x[16 c0 + c] into out[16 b + r]). Values are stored in the dtype of the features they multiply:
// a tensor-core MMA takes both operands in one type (tf32, bf16 or fp16), so the kernel loads
// tiles as they are, and 16-bit tiles move half the bytes of fp32 ones. Duplicate edges are
// summed before that one rounding (by the binding, in fp32 or fp64), so each entry is rounded
// once, as a CSR value is.
//
// The build gives, for each input edge, `pos` = tile * 256 + 16 * (row % 16) + col % 16: its
// slot in the flattened values, so values of any weighting are a scatter-add of per-edge values
// and the gradient of an edge weight is a gather of the gradient of the values.
#pragma once

#include <cstdint>

#include "gnnio/common/types.h"

namespace gnnio {

inline constexpr int kWsbTile = 16;  // tile side; tensor-core MMA fragments are 16 x 16
inline constexpr int kWsbTileSize = kWsbTile * kWsbTile;

inline int64_t wsb_blocks(int64_t n) { return (n + kWsbTile - 1) / kWsbTile; }

struct WsbBuildParams {
  const void* row = nullptr;  // [num_edges] row id of each edge (destination for A)
  const void* col = nullptr;  // [num_edges] column id of each edge (source for A)
  int64_t num_edges = 0;
  int64_t num_rows = 0;  // row ids must lie in [0, num_rows)
  int64_t num_cols = 0;  // column ids must lie in [0, num_cols)
  IndexType index_type = IndexType::kInt64;  // of row, col, block_rowptr and block_col

  void* block_rowptr = nullptr;  // out [wsb_blocks(num_rows) + 1], by wsb_count_tiles_cpu
  void* block_col = nullptr;     // out [num_tiles], by wsb_fill_cpu
  int64_t* pos = nullptr;        // out [num_edges] int64 (a slot may exceed 2^31), by wsb_fill_cpu
};

// Two passes, because the number of tiles (the size of block_col) is known only after the
// first: wsb_count_tiles_cpu fills block_rowptr and returns the number of tiles; wsb_fill_cpu
// (with block_rowptr from the first pass) fills block_col and pos. O(E log d) for d edges per
// block row; no memory proportional to the number of block columns, so bipartite graphs with
// huge column counts are fine. Throws IndexError for ids out of range.
int64_t wsb_count_tiles_cpu(const WsbBuildParams& p);
void wsb_fill_cpu(const WsbBuildParams& p);

// out = A · x over a WSB matrix.
struct WsbSpmmParams {
  const void* block_rowptr = nullptr;  // [wsb_blocks(num_rows) + 1]
  const void* block_col = nullptr;     // [num_tiles]
  IndexType index_type = IndexType::kInt64;
  const void* values = nullptr;  // [num_tiles, 16, 16] row-major, same type as x

  const void* x = nullptr;  // [num_cols, width], rows x_row_stride elements apart, unit column stride
  void* out = nullptr;      // [num_rows, width], rows out_row_stride elements apart
  ScalarType scalar_type = ScalarType::kFloat32;  // of values, x and out

  int64_t num_rows = 0;
  int64_t num_cols = 0;
  int64_t num_tiles = 0;
  int64_t width = 0;
  int64_t x_row_stride = 0;
  int64_t out_row_stride = 0;
};

// The gradient of the tile values: out[t, r, c] = sum_f a[16 b + r, f] * b[16 c0 + c, f] for
// tile t in block row b, block column c0 (0 where the row or column lies past the matrix). A
// dense 16 x 16 product per tile; the gradient of each edge weight is then out at its pos.
struct WsbSddmmParams {
  const void* block_rowptr = nullptr;
  const void* block_col = nullptr;
  IndexType index_type = IndexType::kInt64;

  const void* a = nullptr;  // [num_rows, width] (the output gradient), rows a_row_stride apart
  const void* b = nullptr;  // [num_cols, width] (the input features), rows b_row_stride apart
  void* out = nullptr;      // [num_tiles, 16, 16]
  ScalarType scalar_type = ScalarType::kFloat32;

  int64_t num_rows = 0;
  int64_t num_cols = 0;
  int64_t num_tiles = 0;
  int64_t width = 0;
  int64_t a_row_stride = 0;
  int64_t b_row_stride = 0;
};

// CPU: the same tiled algorithm as the GPU (each tile multiplied densely, stored zeros
// included), OpenMP over block rows; float32 accumulates in float32, float64 in float64. The
// SDDMM accumulates in double, as gnnio's CSR SDDMM does.
void wsb_spmm_cpu(const WsbSpmmParams& p);
void wsb_sddmm_cpu(const WsbSddmmParams& p);

#ifdef GNNIO_WITH_CUDA
// Tensor cores (nvcuda::wmma): float32 inputs as tf32, float16 and bfloat16 as they are, all
// with float32 accumulation. float64 is refused (InvalidArgument): use the CSR kernels.
void wsb_spmm_cuda(const WsbSpmmParams& p, void* stream);
// CUDA cores, float32 accumulation (float64 for float64); every element type.
void wsb_sddmm_cuda(const WsbSddmmParams& p, void* stream);
#endif

}  // namespace gnnio
