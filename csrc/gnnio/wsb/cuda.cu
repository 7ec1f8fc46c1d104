// WSB SpMM on tensor cores, and the tile-gradient SDDMM.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <type_traits>

#include "gnnio/common/convert.cuh"
#include "gnnio/common/cp_async.cuh"
#include "gnnio/common/cuda_check.h"
#include "gnnio/common/vec.cuh"
#include "gnnio/wsb/mma.cuh"
#include "gnnio/wsb/params.h"
#include "gnnio/wsb/policy.h"

namespace gnnio {
namespace {

namespace wmma = nvcuda::wmma;

// One CTA per (block row b, chunk of WsbSpmmConfig::kChunk features). For each tile of the
// block row, in order: the 16 x 16 tile and the 16 x kChunk block of x rows it multiplies are
// staged in shared memory (double-buffered: tile i+1 loads while tile i is multiplied), then
// each warp adds tile · x_block into its kFragsPerWarp 16 x 16 float accumulators. The block
// row's output is written once at the end: no atomics, the result does not depend on
// scheduling. kVec > 1: x rows and the values are 16-byte aligned and the width a multiple of
// kVec, so staging uses 16-byte cp.async; kVec == 1 stages element by element.
template <typename T, typename index_t, int kVec>
__global__ void __launch_bounds__(WsbSpmmConfig::kWarps * 32)
    wsb_spmm_kernel(const index_t* __restrict__ block_rowptr, const index_t* __restrict__ block_col,
                    const T* __restrict__ values, const T* __restrict__ x, T* __restrict__ out,
                    int64_t num_rows, int64_t num_cols, int64_t width, int64_t x_stride,
                    int64_t out_stride) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  using Cfg = WsbSpmmConfig;
  using Tr = MmaTraits<T>;
  constexpr int kThreads = Cfg::kWarps * 32;
  // x block rows padded by 8 elements: still a 16-byte multiple (cp.async) and a multiple of 8
  // (wmma's ldm), and consecutive rows start on different banks.
  constexpr int kLd = Cfg::kChunk + 8;
  // wmma loads need 256-bit aligned fragment pointers: every offset used below is a multiple
  // of 32 bytes from these 128-byte aligned bases.
  __shared__ __align__(128) T vs[2][kWsbTileSize];
  __shared__ __align__(128) T xs[2][kWsbTile * kLd];
  __shared__ __align__(128) float os[Cfg::kWarps][kWsbTileSize];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = blockIdx.x;
  const int64_t f0 = int64_t(blockIdx.y) * Cfg::kChunk;
  const int64_t begin = block_rowptr[b], end = block_rowptr[b + 1];
  const T zero = from_acc<T>(0.f);

  auto stage = [&](int64_t t, int buf) {
    const int64_t c0 = int64_t(block_col[t]) * kWsbTile;
    const T* tile = values + t * kWsbTileSize;
    if constexpr (kVec > 1) {
      for (int i = threadIdx.x; i < kWsbTileSize / kVec; i += kThreads)
        cp_async16(&vs[buf][i * kVec], tile + i * kVec, true);
      constexpr int kRowVecs = Cfg::kChunk / kVec;
      for (int i = threadIdx.x; i < kWsbTile * kRowVecs; i += kThreads) {
        const int r = i / kRowVecs, f = (i % kRowVecs) * kVec;
        const bool ok = c0 + r < num_cols && f0 + f < width;
        cp_async16(&xs[buf][r * kLd + f], ok ? x + (c0 + r) * x_stride + f0 + f : x, ok);
      }
    } else {
      for (int i = threadIdx.x; i < kWsbTileSize; i += kThreads) vs[buf][i] = tile[i];
      for (int i = threadIdx.x; i < kWsbTile * Cfg::kChunk; i += kThreads) {
        const int r = i / Cfg::kChunk, f = i % Cfg::kChunk;
        const bool ok = c0 + r < num_cols && f0 + f < width;
        xs[buf][r * kLd + f] = ok ? x[(c0 + r) * x_stride + f0 + f] : zero;
      }
    }
  };

  wmma::fragment<wmma::accumulator, 16, 16, Tr::kK, float> acc[Cfg::kFragsPerWarp];
  for (int j = 0; j < Cfg::kFragsPerWarp; ++j) wmma::fill_fragment(acc[j], 0.f);

  if (begin < end) stage(begin, 0);
  cp_async_commit();
  int buf = 0;
  for (int64_t t = begin; t < end; ++t) {
    if (t + 1 < end) stage(t + 1, buf ^ 1);
    cp_async_commit();
    cp_async_wait_all_but_newest();  // tile t has landed (only tile t+1 may be in flight)
    __syncthreads();
    for (int k = 0; k < kWsbTile; k += Tr::kK) {
      wmma::fragment<wmma::matrix_a, 16, 16, Tr::kK, typename Tr::operand, wmma::row_major> a;
      wmma::load_matrix_sync(a, &vs[buf][k], kWsbTile);
      to_operand<T>(a);
      for (int j = 0; j < Cfg::kFragsPerWarp; ++j) {
        const int col = (warp * Cfg::kFragsPerWarp + j) * 16;
        if (f0 + col >= width) break;  // warp-uniform: this fragment lies past the features
        wmma::fragment<wmma::matrix_b, 16, 16, Tr::kK, typename Tr::operand, wmma::row_major> xb;
        wmma::load_matrix_sync(xb, &xs[buf][k * kLd + col], kLd);
        to_operand<T>(xb);
        wmma::mma_sync(acc[j], a, xb, acc[j]);
      }
    }
    __syncthreads();  // buffer `buf` is staged again two tiles from now
    buf ^= 1;
  }

  for (int j = 0; j < Cfg::kFragsPerWarp; ++j) {
    const int col = (warp * Cfg::kFragsPerWarp + j) * 16;
    if (f0 + col >= width) break;
    wmma::store_matrix_sync(os[warp], acc[j], kWsbTile, wmma::mem_row_major);
    __syncwarp();
    for (int i = lane; i < kWsbTileSize; i += 32) {
      const int64_t row = b * kWsbTile + i / kWsbTile, f = f0 + col + i % kWsbTile;
      if (row < num_rows && f < width) out[row * out_stride + f] = from_acc<T>(os[warp][i]);
    }
    __syncwarp();
  }
#endif
}

template <typename T, typename index_t>
void launch_spmm(const WsbSpmmParams& p, cudaStream_t stream) {
  const int64_t block_rows = wsb_blocks(p.num_rows);
  const int64_t chunks = (p.width + WsbSpmmConfig::kChunk - 1) / WsbSpmmConfig::kChunk;
  GNNIO_CHECK(chunks <= 65535 && block_rows <= INT32_MAX, ErrorKind::kInvalidArgument,
              "wsb_spmm: ", p.num_rows, " rows x ", p.width, " features exceed one launch's grid");
  const dim3 grid(static_cast<unsigned>(block_rows), static_cast<unsigned>(chunks));
  constexpr int kThreads = WsbSpmmConfig::kWarps * 32;
  const auto* block_rowptr = static_cast<const index_t*>(p.block_rowptr);
  const auto* block_col = static_cast<const index_t*>(p.block_col);
  const auto* values = static_cast<const T*>(p.values);
  const auto* x = static_cast<const T*>(p.x);
  auto* out = static_cast<T*>(p.out);
  if (vector_width<T>(p.width, {p.x_row_stride}, {p.x, p.values}) > 1) {
    wsb_spmm_kernel<T, index_t, 16 / sizeof(T)><<<grid, kThreads, 0, stream>>>(
        block_rowptr, block_col, values, x, out, p.num_rows, p.num_cols, p.width, p.x_row_stride,
        p.out_row_stride);
  } else {
    wsb_spmm_kernel<T, index_t, 1><<<grid, kThreads, 0, stream>>>(
        block_rowptr, block_col, values, x, out, p.num_rows, p.num_cols, p.width, p.x_row_stride,
        p.out_row_stride);
  }
  GNNIO_CUDA_CHECK(cudaGetLastError());
}

// ---------------------------------------------------------------------------------------------
// Tile gradient: one warp per tile (its block row found by binary search in block_rowptr).
// Lane (r, half) owns out[t, r, 8 half .. 8 half + 7]; 32 features at a time of the tile's 16
// rows of a and 16 rows of b are staged in shared memory (padded rows: no bank conflicts).

template <typename T, typename index_t>
__global__ void __launch_bounds__(WsbSddmmConfig::kWarps * 32)
    wsb_sddmm_kernel(const index_t* __restrict__ block_rowptr, const index_t* __restrict__ block_col,
                     const T* __restrict__ a, const T* __restrict__ bm, T* __restrict__ out,
                     int64_t num_rows, int64_t num_cols, int64_t block_rows, int64_t num_tiles,
                     int64_t width, int64_t a_stride, int64_t b_stride) {
  using acc_t = acc_type_t<T>;
  constexpr int kWarps = WsbSddmmConfig::kWarps;
  __shared__ acc_t as[kWarps][kWsbTile][33];
  __shared__ acc_t bs[kWarps][kWsbTile][33];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = lane / 2, c_base = (lane % 2) * 8;
  for (int64_t t = int64_t(blockIdx.x) * kWarps + warp; t < num_tiles;
       t += int64_t(gridDim.x) * kWarps) {
    int64_t lo = 0, hi = block_rows;  // last block row whose first tile is <= t
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (int64_t(block_rowptr[mid]) <= t) lo = mid; else hi = mid;
    }
    const int64_t r0 = lo * kWsbTile, c0 = int64_t(block_col[t]) * kWsbTile;
    acc_t acc[8] = {};
    for (int64_t f0 = 0; f0 < width; f0 += 32) {
      const int64_t f = f0 + lane;
      for (int i = 0; i < kWsbTile; ++i) {
        as[warp][i][lane] = r0 + i < num_rows && f < width ? to_acc(a[(r0 + i) * a_stride + f]) : acc_t(0);
        bs[warp][i][lane] = c0 + i < num_cols && f < width ? to_acc(bm[(c0 + i) * b_stride + f]) : acc_t(0);
      }
      __syncwarp();
      for (int k = 0; k < 32; ++k) {
        const acc_t av = as[warp][r][k];
        for (int j = 0; j < 8; ++j) acc[j] += av * bs[warp][c_base + j][k];
      }
      __syncwarp();
    }
    T* o = out + t * kWsbTileSize + r * kWsbTile + c_base;
    for (int j = 0; j < 8; ++j) o[j] = from_acc<T>(acc[j]);
  }
}

template <typename T, typename index_t>
void launch_sddmm(const WsbSddmmParams& p, cudaStream_t stream) {
  constexpr int kWarps = WsbSddmmConfig::kWarps;
  const int64_t blocks = std::min<int64_t>((p.num_tiles + kWarps - 1) / kWarps, 1 << 20);
  wsb_sddmm_kernel<T, index_t><<<static_cast<int>(blocks), kWarps * 32, 0, stream>>>(
      static_cast<const index_t*>(p.block_rowptr), static_cast<const index_t*>(p.block_col),
      static_cast<const T*>(p.a), static_cast<const T*>(p.b), static_cast<T*>(p.out), p.num_rows,
      p.num_cols, wsb_blocks(p.num_rows), p.num_tiles, p.width, p.a_row_stride, p.b_row_stride);
  GNNIO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void wsb_spmm_cuda(const WsbSpmmParams& p, void* stream) {
  if (p.num_rows == 0 || p.width == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_index(p.index_type, [&](auto index) {
    using index_t = decltype(index);
    switch (p.scalar_type) {
      case ScalarType::kFloat32: return launch_spmm<float, index_t>(p, s);
      case ScalarType::kFloat16: return launch_spmm<__half, index_t>(p, s);
      case ScalarType::kBFloat16: return launch_spmm<__nv_bfloat16, index_t>(p, s);
      case ScalarType::kFloat64:
        detail::fail(ErrorKind::kInvalidArgument,
                     "wsb_spmm on CUDA runs on tensor cores and takes float32 (as tf32), float16 "
                     "or bfloat16, got float64; use the CSR backend for float64");
    }
  });
}

void wsb_sddmm_cuda(const WsbSddmmParams& p, void* stream) {
  if (p.num_tiles == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_cuda(p.scalar_type, p.index_type, [&](auto scalar, auto index) {
    launch_sddmm<decltype(scalar), decltype(index)>(p, s);
  });
}

}  // namespace gnnio
