// Compressed sparse rows built from a COO edge list, with the permutation back to edge order.
//
// gnnio stores a graph as csr_by_dst (row = destination, the layout every forward aggregation
// reads) and csr_by_src (its transpose, for backward passes). Both are built by the same stable
// sort, so the edges of one row keep their input order on every device: CPU and CUDA builds give
// bit-identical CSRs, and ties in later reductions resolve the same way everywhere.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gnnio/common/types.h"

namespace gnnio {

struct CsrBuildParams {
  const void* row = nullptr;  // [num_edges] row id of each edge (destination for csr_by_dst)
  const void* col = nullptr;  // [num_edges] column id of each edge (source for csr_by_dst)
  int64_t num_edges = 0;
  int64_t num_rows = 0;  // row ids must lie in [0, num_rows)
  int64_t num_cols = 0;  // column ids must lie in [0, num_cols)
  IndexType index_type = IndexType::kInt64;  // type of row, col and of every output

  void* rowptr = nullptr;      // out [num_rows + 1] offsets of each row's edges
  void* col_sorted = nullptr;  // out [num_edges] column of each CSR slot
  void* perm = nullptr;        // out [num_edges] input edge id of each CSR slot
};

// Counting sort, O(num_edges + num_rows). Throws IndexError for ids out of range.
void csr_build_cpu(const CsrBuildParams& p);

#ifdef GNNIO_WITH_CUDA
// Radix sort (CUB) on the device. Ids must have been range-checked by the caller: the kernel
// does not read them back to the host. `stream` is a cudaStream_t.
size_t csr_build_cuda_workspace_bytes(const CsrBuildParams& p);
void csr_build_cuda(const CsrBuildParams& p, void* workspace, size_t workspace_bytes, void* stream);
#endif

}  // namespace gnnio
