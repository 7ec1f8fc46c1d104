// Column sums of a row-major [rows, cols] matrix: out[c] = sum_r x[r, c]. What every bias
// gradient is (d b = the column sums of d y over the nodes), and GATv2's d att from its
// per-block partials. torch's x.sum(0) took 0.29 ms on a 1M x 128 float32 gradient on an H200,
// 2.4x the 0.12 ms it takes to read it (bench/NOTES.md, v11); a GATv2 layer's training step sums
// four such.
//
// The rows are cut into slabs (column_sum_slab_rows); within a slab, row r goes to lane
// (r - first row) % kColumnSumLanes, each lane sums its rows in order, the lanes are added in
// lane order; then slab s's partial goes to finish lane s % kColumnSumFinishLanes, each finish lane
// sums its slabs in order, and the finish lanes are added by a fixed tree (lane j += lane j + h for
// h = 16, 8, 4, 2, 1; the sum is lane 0's), all in float64. A fixed order on the CPU and the GPU
// and for any thread count: the same bits every run and on both. With float64 sums of float32
// (or 16-bit) terms, the result is within one rounding to the output type of the exact sum plus
// (rows) 2^-53 sum |x|.
#pragma once

#include <cstdint>

#include "gnnio/common/types.h"

namespace gnnio {

inline constexpr int64_t kColumnSumLanes = 8;  // the CUDA block's warps
inline constexpr int64_t kColumnSumFinishLanes = 32;  // the second pass's lanes per column

struct ColumnSumParams {
  const void* x = nullptr;  // [rows, cols] contiguous, scalar_type
  void* out = nullptr;      // [cols], scalar_type
  ScalarType scalar_type = ScalarType::kFloat32;
  int64_t rows = 0;
  int64_t cols = 0;
};

// Rows per slab: enough slabs to fill a GPU several times over at 1M rows, few enough that the
// second pass over [slabs, cols] float64 partials is a small fraction of the first.
inline int64_t column_sum_slab_rows(int64_t rows) {
  constexpr int64_t kMinSlabRows = 256, kMaxSlabs = 2048;
  const int64_t by_count = (rows + kMaxSlabs - 1) / kMaxSlabs;
  return by_count > kMinSlabRows ? by_count : kMinSlabRows;
}

inline int64_t column_sum_slabs(int64_t rows) {
  const int64_t slab = column_sum_slab_rows(rows);
  return (rows + slab - 1) / slab;
}

void column_sum_cpu(const ColumnSumParams& p);

#ifdef GNNIO_WITH_CUDA
// Workspace: column_sum_slabs(rows) x cols float64 partials.
size_t column_sum_cuda_workspace_bytes(const ColumnSumParams& p);
void column_sum_cuda(const ColumnSumParams& p, void* workspace, void* stream);
#endif

}  // namespace gnnio
