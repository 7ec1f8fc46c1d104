// The reduction family: out[r, f] = max (or min) over the CSR slots k of row r of x[col[k], f],
// with arg[r, f] = the winning slot k, so the backward pass routes each gradient to exactly one
// input without any E x F buffer. Rows without slots give 0 and arg -1 (PyG's value for empty
// groups). Ties go to the lowest slot, i.e. the earliest edge of the input order (the CSR build
// is stable), on every device and every run. NaN wins over any number (as torch.amax).
// Weighted (a weight per slot, PyG's GraphConv edge_weight or a sparse adjacency's values):
// each candidate is w[k] * x[col[k], f] rounded to the element type, as PyG's message
// edge_weight * x_j, and out holds that product.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gnnio/common/row_split.h"
#include "gnnio/common/types.h"

namespace gnnio {

enum class ReduceOp { kMax, kMin };

struct SegmentReduceParams {
  const void* rowptr = nullptr;  // [num_rows + 1]
  const void* col = nullptr;     // [nnz]
  IndexType index_type = IndexType::kInt64;  // also the type of arg

  const void* x = nullptr;  // [num_cols, width], rows x_row_stride apart, unit feature stride
  const void* weight = nullptr;  // [nnz] in slot order, x's element type; nullptr: unweighted
  void* out = nullptr;      // [num_rows, width] contiguous
  void* arg = nullptr;      // [num_rows, width] contiguous: winning slot, -1 for empty rows
  ScalarType scalar_type = ScalarType::kFloat32;
  ReduceOp op = ReduceOp::kMax;

  int64_t num_rows = 0;
  int64_t num_cols = 0;
  int64_t nnz = 0;
  int64_t width = 0;
  int64_t x_row_stride = 0;

  // Degree-aware split (CUDA; chosen by the planner, gnnio.plan.plan_reduce). Rows listed in
  // split.heavy_rows are skipped by the light (warp per row) kernel and reduced instead by 2-D
  // tiles over the work items, merged exactly with 64-bit atomics on packed (value, slot) keys.
  // split.num_heavy == 0: every row is light (node-parallel variant).
  RowSplit split;
};

// grad_x[j, f] = sum over the slots k' of row j of the transposed CSR whose forward slot
// t2c[k'] won (arg[col_t[k'], f] == t2c[k']) of grad_out[col_t[k'], f], times weight[k'] when
// weighted (the weights in transposed slot order, so the walk reads them in order). A gather
// over the transpose: each output element is summed by one thread in slot order
// (deterministic).
struct SegmentReduceBackwardParams {
  const void* rowptr_t = nullptr;  // [num_src + 1]
  const void* col_t = nullptr;     // [nnz] destination row of each transposed slot
  const void* t2c = nullptr;       // [nnz] forward (csr_by_dst) slot of each transposed slot
  const void* arg = nullptr;       // [num_dst, width]
  IndexType index_type = IndexType::kInt64;
  const void* weight = nullptr;    // [nnz] in transposed slot order, or nullptr (unweighted)

  const void* grad_out = nullptr;  // [num_dst, width] contiguous
  void* grad_x = nullptr;          // [num_src, width] contiguous
  ScalarType scalar_type = ScalarType::kFloat32;

  int64_t num_src = 0;
  int64_t width = 0;

  // The same degree-aware split over the transpose (CUDA): sources with more than
  // split.light_max_degree out-edges are summed by 2-D tiles into per-item partials, which a
  // second kernel adds in item order (fixed order: still the same bits every run).
  RowSplit split;
};

// The weights' gradient: grad_weight[k] = sum over the features f where slot k won
// (arg[r, f] == k, r its row) of grad_out[r, f] * x[col[k], f]. Each row's features are
// visited in order by one thread (one loop iteration on the CPU), the product rounded and then
// added in the accumulator type: the same order and roundings on both devices, no atomics.
struct SegmentReduceWeightGradParams {
  const void* col = nullptr;     // [nnz]
  const void* arg = nullptr;     // [num_rows, width] contiguous
  IndexType index_type = IndexType::kInt64;

  const void* x = nullptr;         // [num_cols, width], rows x_row_stride apart
  const void* grad_out = nullptr;  // [num_rows, width] contiguous
  void* grad_weight = nullptr;     // [nnz], zero on entry; float (double for float64)
  ScalarType scalar_type = ScalarType::kFloat32;  // of x and grad_out

  int64_t num_rows = 0;
  int64_t width = 0;
  int64_t x_row_stride = 0;
};

void segment_reduce_cpu(const SegmentReduceParams& p);
void segment_reduce_backward_cpu(const SegmentReduceBackwardParams& p);
void segment_reduce_weight_grad_cpu(const SegmentReduceWeightGradParams& p);

#ifdef GNNIO_WITH_CUDA
// Workspace: num_heavy * width 64-bit keys (0 bytes without heavy rows).
size_t segment_reduce_cuda_workspace_bytes(const SegmentReduceParams& p);
void segment_reduce_cuda(const SegmentReduceParams& p, void* workspace, void* stream);
// Workspace: num_items * width accumulators (float, double for float64).
size_t segment_reduce_backward_cuda_workspace_bytes(const SegmentReduceBackwardParams& p);
void segment_reduce_backward_cuda(const SegmentReduceBackwardParams& p, void* workspace, void* stream);
void segment_reduce_weight_grad_cuda(const SegmentReduceWeightGradParams& p, void* stream);
#endif

}  // namespace gnnio
