// Column sums on CUDA (column_sum.h). Pass 1: one block per (slab, tile of 32 columns); lane x of
// the block owns column c0 + x, and its 8 warps take the slab's rows round-robin (warp w: rows
// w, w + 8, ...), so each warp reads 32 consecutive elements of a row (coalesced) and keeps
// kUnroll independent loads in flight; the 8 warps' float64 sums are then added in warp order.
// Pass 2: a block per 32 columns, 32 lanes of slabs per column, added by a fixed tree.
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
      // float for float32 and 16-bit terms (exact in float64 all the same), double for float64.
      decltype(to_acc(scalar_t{})) v[kUnroll];
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

// Pass 2: a block per tile of 32 columns; thread (x, y) adds the partials of slabs y, y + 32, ...
// of column c0 + x in slab order (a warp reads 32 consecutive partials of a slab), then the 32
// lanes are added by the fixed tree of column_sum.h. One thread per column adding 2,048 partials
// in a row took 224 us (bench/NOTES.md, v11); this is ~32x shorter.
template <typename scalar_t>
__global__ void __launch_bounds__(kTileCols * kColumnSumFinishLanes)
    finish_kernel(const double* __restrict__ partial, scalar_t* __restrict__ out, int64_t slabs,
                  int64_t cols) {
  constexpr int kLanes = static_cast<int>(kColumnSumFinishLanes);
  __shared__ double lane_sums[kLanes][kTileCols + 1];
  const int64_t c = int64_t(blockIdx.x) * kTileCols + threadIdx.x;
  double sum = 0.0;
  if (c < cols) {
    int64_t s = threadIdx.y;
    for (; s + int64_t(kUnroll - 1) * kLanes < slabs; s += int64_t(kUnroll) * kLanes) {
      double v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = partial[(s + int64_t(u) * kLanes) * cols + c];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) sum += v[u];
    }
    for (; s < slabs; s += kLanes) sum += partial[s * cols + c];
  }
  lane_sums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
#pragma unroll
  for (int half = kLanes / 2; half > 0; half /= 2) {
    if (threadIdx.y < half)
      lane_sums[threadIdx.y][threadIdx.x] += lane_sums[threadIdx.y + half][threadIdx.x];
    __syncthreads();
  }
  if (threadIdx.y == 0 && c < cols) out[c] = from_acc<scalar_t>(lane_sums[0][threadIdx.x]);
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
    finish_kernel<scalar_t><<<static_cast<unsigned>((p.cols + kTileCols - 1) / kTileCols),
                              dim3(kTileCols, static_cast<unsigned>(kColumnSumFinishLanes)), 0, s>>>(
        partial, static_cast<scalar_t*>(p.out), slabs, p.cols);
    GNNIO_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace gnnio
