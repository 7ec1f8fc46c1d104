#include <cub/device/device_radix_sort.cuh>

#include "gnnio/common/cuda_check.h"
#include "gnnio/common/workspace.h"
#include "gnnio/graph/csr.h"

namespace gnnio {
namespace {

constexpr int kThreads = 256;

template <typename index_t>
__global__ void iota_kernel(index_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    out[i] = static_cast<index_t>(i);
}

// Slot k of the sorted keys writes rowptr for every row in (key[k-1], key[k]]; the extra slot
// k == num_edges closes the rows after the last key. Each rowptr entry has exactly one writer.
template <typename index_t>
__global__ void rowptr_and_gather_kernel(const index_t* __restrict__ sorted_row,
                                         const index_t* __restrict__ perm,
                                         const index_t* __restrict__ col,
                                         index_t* __restrict__ rowptr,
                                         index_t* __restrict__ col_sorted, int64_t num_edges,
                                         int64_t num_rows) {
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k <= num_edges;
       k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t prev = k == 0 ? -1 : int64_t(sorted_row[k - 1]);
    const int64_t cur = k == num_edges ? num_rows : int64_t(sorted_row[k]);
    for (int64_t r = prev + 1; r <= cur; ++r) rowptr[r] = static_cast<index_t>(k);
    if (k < num_edges) col_sorted[k] = col[perm[k]];
  }
}

int bits_for(int64_t n) {
  int bits = 1;
  while (bits < 63 && (int64_t(1) << bits) < n) ++bits;
  return bits;
}

int grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 * 16 ? (blocks > 0 ? blocks : 1) : 65535 * 16);
}

// Workspace layout: [sorted_row | iota | cub temp].
template <typename index_t>
size_t cub_bytes(const CsrBuildParams& p) {
  size_t bytes = 0;
  GNNIO_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, bytes, static_cast<const index_t*>(nullptr), static_cast<index_t*>(nullptr),
      static_cast<const index_t*>(nullptr), static_cast<index_t*>(nullptr), p.num_edges, 0,
      bits_for(p.num_rows)));
  return bytes;
}

template <typename index_t>
size_t workspace_bytes(const CsrBuildParams& p) {
  return 2 * workspace_align(sizeof(index_t) * p.num_edges) + cub_bytes<index_t>(p);
}

template <typename index_t>
void build(const CsrBuildParams& p, void* workspace, size_t bytes, cudaStream_t stream) {
  GNNIO_CHECK(bytes >= workspace_bytes<index_t>(p), ErrorKind::kInternal,
              "csr_build_cuda: workspace too small");
  auto* base = static_cast<char*>(workspace);
  auto* sorted_row = reinterpret_cast<index_t*>(base);
  auto* iota = reinterpret_cast<index_t*>(base + workspace_align(sizeof(index_t) * p.num_edges));
  void* temp = base + 2 * workspace_align(sizeof(index_t) * p.num_edges);
  size_t temp_bytes = cub_bytes<index_t>(p);

  if (p.num_edges > 0) {
    iota_kernel<<<grid_for(p.num_edges), kThreads, 0, stream>>>(iota, p.num_edges);
    GNNIO_CUDA_CHECK(cudaGetLastError());
    GNNIO_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
        temp, temp_bytes, static_cast<const index_t*>(p.row), sorted_row, iota,
        static_cast<index_t*>(p.perm), p.num_edges, 0, bits_for(p.num_rows), stream));
  }
  rowptr_and_gather_kernel<<<grid_for(p.num_edges + 1), kThreads, 0, stream>>>(
      sorted_row, static_cast<const index_t*>(p.perm), static_cast<const index_t*>(p.col),
      static_cast<index_t*>(p.rowptr), static_cast<index_t*>(p.col_sorted), p.num_edges,
      p.num_rows);
  GNNIO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

size_t csr_build_cuda_workspace_bytes(const CsrBuildParams& p) {
  return dispatch_index(p.index_type,
                        [&](auto tag) { return workspace_bytes<decltype(tag)>(p); });
}

void csr_build_cuda(const CsrBuildParams& p, void* workspace, size_t workspace_bytes,
                    void* stream) {
  dispatch_index(p.index_type, [&](auto tag) {
    build<decltype(tag)>(p, workspace, workspace_bytes, static_cast<cudaStream_t>(stream));
  });
}

}  // namespace gnnio
