// Column sums on CUDA (column_sum.h). Pass 1: one block per (slab, tile of 32 columns); lane x of
// the block owns column c0 + x, and its 8 warps take the slab's rows round-robin (warp w: rows
// w, w + 8, ...), so each warp reads 32 consecutive elements of a row (coalesced) and keeps
// kUnroll independent loads in flight; the 8 warps' float64 sums are then added in warp order.
// Pass 2: one thread per column adds the slabs' partials in slab order.
#include <cuda_runtime.h>

#include "gnnio/common/convert.cuh"
#include "gnnio/common/cuda_check.h"
#include "gnnio/dense/column_sum.h"

namespace gnnio {
namespace {

constexpr int kTileCols = 32;
constexpr int kWarps = static_cast<int>(kColumnSumLanes);
constexpr int kUnroll = 8;  // loads in flight per thread: ~64 KB a wave per SM, HBM's latency

template <typename scalar_t>
__global__ void __launch_bounds__(kTileCols * kWarps)
    slab_sums_kernel(const scalar_t* __restrict__ x, double* __restrict__ partial, int64_t rows,
                     int64_t cols, int64_t slab_rows) {
  __shared__ double warp_sums[kWarps][kTileCols];
  const int64_t slab = blockIdx.x, c = int64_t(blockIdx.y) * kTileCols + threadIdx.x;
  const int64_t begin = slab * slab_rows;
  const int64_t end = begin + slab_rows < rows ? begin + slab_rows : rows;
  double sum = 0.0;
  if (c < cols) {
    int64_t r = begin + threadIdx.y;
    // Whole rounds of kUnroll rows per warp first: their loads are issued before any add.
    for (; r + int64_t(kUnroll - 1) * kWarps < end; r += int64_t(kUnroll) * kWarps) {
      float v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = to_acc(x[(r + int64_t(u) * kWarps) * cols + c]);
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) sum += v[u];
    }
    for (; r < end; r += kWarps) sum += to_acc(x[r * cols + c]);
  }
  warp_sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  double total = 0.0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += warp_sums[w][threadIdx.x];
  partial[slab * cols + c] = total;
}

// float64 input: the same kernel would round each element to float; keep it exact.
template <>
__global__ void __launch_bounds__(kTileCols * kWarps)
    slab_sums_kernel<double>(const double* __restrict__ x, double* __restrict__ partial,
                             int64_t rows, int64_t cols, int64_t slab_rows) {
  __shared__ double warp_sums[kWarps][kTileCols];
  const int64_t slab = blockIdx.x, c = int64_t(blockIdx.y) * kTileCols + threadIdx.x;
  const int64_t begin = slab * slab_rows;
  const int64_t end = begin + slab_rows < rows ? begin + slab_rows : rows;
  double sum = 0.0;
  if (c < cols)
    for (int64_t r = begin + threadIdx.y; r < end; r += kWarps) sum += x[r * cols + c];
  warp_sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || c >= cols) return;
  double total = 0.0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += warp_sums[w][threadIdx.x];
  partial[slab * cols + c] = total;
}

template <typename scalar_t>
__global__ void finish_kernel(const double* __restrict__ partial, scalar_t* __restrict__ out,
                              int64_t slabs, int64_t cols) {
  const int64_t c = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (c >= cols) return;
  double sum = 0.0;
  for (int64_t s = 0; s < slabs; ++s) sum += partial[s * cols + c];
  out[c] = from_acc<scalar_t>(sum);
}

}  // namespace

size_t column_sum_cuda_workspace_bytes(const ColumnSumParams& p) {
  return static_cast<size_t>(column_sum_slabs(p.rows) * p.cols) * sizeof(double);
}

void column_sum_cuda(const ColumnSumParams& p, void* workspace, void* stream) {
  GNNIO_CHECK(p.rows >= 0 && p.cols >= 0, ErrorKind::kInvalidArgument, "column_sum: negative size");
  GNNIO_CHECK((p.cols + kTileCols - 1) / kTileCols <= 65535, ErrorKind::kInvalidArgument,
              "column_sum on CUDA supports up to ", 65535 * kTileCols, " columns, got ", p.cols);
  if (p.cols == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t slabs = column_sum_slabs(p.rows), slab_rows = column_sum_slab_rows(p.rows);
  auto* partial = static_cast<double*>(workspace);
  dispatch_cuda(p.scalar_type, IndexType::kInt64, [&](auto scalar, auto) {
    using scalar_t = decltype(scalar);
    if (slabs > 0) {
      const dim3 grid(static_cast<unsigned>(slabs),
                      static_cast<unsigned>((p.cols + kTileCols - 1) / kTileCols));
      slab_sums_kernel<scalar_t><<<grid, dim3(kTileCols, kWarps), 0, s>>>(
          static_cast<const scalar_t*>(p.x), partial, p.rows, p.cols, slab_rows);
      GNNIO_CUDA_CHECK(cudaGetLastError());
    }
    finish_kernel<scalar_t><<<static_cast<unsigned>((p.cols + 255) / 256), 256, 0, s>>>(
        partial, static_cast<scalar_t*>(p.out), slabs, p.cols);
    GNNIO_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace gnnio
