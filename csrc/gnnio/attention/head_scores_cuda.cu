// CUDA kernels of the fused GAT scores (head_scores.h). Forward: a group of G lanes owns one
// (row, head) segment at a time and sums each vector's products with a butterfly of shuffles:
// x is read once, coalesced. With rows of at most 32 pieces (head_scores_piece; the common case:
// 4 x 32 float32 is a 512-byte row, 8 lanes of 16 bytes a head, 8 of 8 bytes in bfloat16) each
// lane loads one piece, and a group takes kUnroll segments per round with their loads issued
// first; otherwise (G the power of two at or above the channel count) each lane strides over
// single channels. The single-channel
// kernel alone was a warp per 128-byte segment, 4M one-load warps on powerlaw-1M-16M: 1.29 ms
// for 0.5 GB (NOTES v13). Backward: one block per chunk of kHeadScoreChunkRows rows, a thread per
// (head, channel) column walking the chunk's rows in order: it writes d x and keeps each
// vector's d att partial in a register, written once per chunk; with 16-byte rows a thread
// owns a 16-byte piece of columns instead, the same sums in the same order.
#include <cuda_runtime.h>

#include "gnnio/attention/head_scores.h"
#include "gnnio/common/convert.cuh"
#include "gnnio/common/cuda_check.h"
#include "gnnio/common/vec.cuh"

namespace gnnio {
namespace {

constexpr int kMaxAtt = 4;
constexpr int kForwardThreads = 256;
constexpr int kBackwardMaxThreads = 256;
constexpr int kBackwardRows = 4;  // rows whose loads a 16-byte backward thread issues together

template <typename scalar_t, int G>
__global__ void __launch_bounds__(kForwardThreads)
    head_scores_kernel(const scalar_t* __restrict__ x, const acc_type_t<scalar_t>* __restrict__ att,
                       acc_type_t<scalar_t>* __restrict__ score, int64_t num_segments, int heads,
                       int channels, int num_att) {
  using acc_t = acc_type_t<scalar_t>;
  const int lane = threadIdx.x % G;
  const int64_t groups_per_grid = int64_t(gridDim.x) * (kForwardThreads / G);
  const int64_t first = int64_t(blockIdx.x) * (kForwardThreads / G) + threadIdx.x / G;
  // Every lane of a warp runs the same number of rounds, so the shuffles see full warps.
  const int64_t rounds = (num_segments + groups_per_grid - 1) / groups_per_grid;
  for (int64_t round = 0; round < rounds; ++round) {
    const int64_t s = first + round * groups_per_grid;  // segment = row * heads + head
    const bool valid = s < num_segments;
    const int h = valid ? int(s % heads) : 0;
    acc_t sum[kMaxAtt];
#pragma unroll
    for (int a = 0; a < kMaxAtt; ++a) sum[a] = acc_t(0);
    if (valid) {
      const scalar_t* xs = x + s * channels;
      for (int c = lane; c < channels; c += G) {
        const acc_t v = to_acc(xs[c]);
#pragma unroll
        for (int a = 0; a < kMaxAtt; ++a)
          if (a < num_att) sum[a] += v * att[(int64_t(a) * heads + h) * channels + c];
      }
    }
#pragma unroll
    for (int a = 0; a < kMaxAtt; ++a) {
      if (a >= num_att) break;
#pragma unroll
      for (int offset = G / 2; offset > 0; offset /= 2)
        sum[a] += __shfl_xor_sync(0xffffffffu, sum[a], offset);
    }
    if (valid && lane == 0) {
      for (int a = 0; a < num_att; ++a) score[a * num_segments + s] = sum[a];
    }
  }
}

constexpr int kUnroll = 4;

// The piece path (see the top): lane `lane` holds channels lane * V .. lane * V + V - 1 of a
// segment (zeros past the head's last channel); the launcher checked (head_scores_piece) x's
// alignment and that channels is a multiple of V and at most G * V.
template <typename scalar_t, int G, int V>
__global__ void __launch_bounds__(kForwardThreads)
    head_scores_vec_kernel(const scalar_t* __restrict__ x, const acc_type_t<scalar_t>* __restrict__ att,
                           acc_type_t<scalar_t>* __restrict__ score, int64_t num_segments, int heads,
                           int channels, int num_att) {
  using acc_t = acc_type_t<scalar_t>;
  const int lane = threadIdx.x % G, c0 = lane * V;
  const bool has_channels = c0 < channels;
  const int64_t groups_per_grid = int64_t(gridDim.x) * (kForwardThreads / G);
  const int64_t first = int64_t(blockIdx.x) * (kForwardThreads / G) + threadIdx.x / G;
  // Every lane of a warp runs the same rounds, so the shuffles see full warps.
  const int64_t rounds = (num_segments + groups_per_grid - 1) / groups_per_grid;
  for (int64_t round = 0; round < rounds; round += kUnroll) {
    acc_t v[kUnroll][V];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {  // the loads of all kUnroll segments first
      const int64_t s = first + (round + u) * groups_per_grid;
      if (has_channels && s < num_segments) {
        const auto piece = load_vec<V>(x + s * channels + c0);
#pragma unroll
        for (int e = 0; e < V; ++e) v[u][e] = to_acc(piece.v[e]);
      } else {
#pragma unroll
        for (int e = 0; e < V; ++e) v[u][e] = acc_t(0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t s = first + (round + u) * groups_per_grid;
      const bool valid = s < num_segments;
      const int h = valid ? int(s % heads) : 0;
      acc_t sum[kMaxAtt];
#pragma unroll
      for (int a = 0; a < kMaxAtt; ++a) {
        sum[a] = acc_t(0);
        if (a >= num_att || !has_channels) continue;
        const acc_t* att_row = att + (int64_t(a) * heads + h) * channels + c0;
#pragma unroll
        for (int e = 0; e < V; ++e) sum[a] = fma_pinned(v[u][e], att_row[e], sum[a]);
      }
#pragma unroll
      for (int a = 0; a < kMaxAtt; ++a) {
        if (a >= num_att) break;
#pragma unroll
        for (int offset = G / 2; offset > 0; offset /= 2)
          sum[a] += __shfl_xor_sync(0xffffffffu, sum[a], offset);
      }
      if (valid && lane == 0) {
        for (int a = 0; a < num_att; ++a) score[a * num_segments + s] = sum[a];
      }
    }
  }
}

template <typename scalar_t>
__global__ void __launch_bounds__(kBackwardMaxThreads)
    head_scores_backward_kernel(const scalar_t* __restrict__ x,
                                const acc_type_t<scalar_t>* __restrict__ att,
                                const acc_type_t<scalar_t>* __restrict__ grad_score,
                                scalar_t* __restrict__ grad_x, acc_type_t<scalar_t>* __restrict__ partials,
                                int64_t num_rows, int heads, int channels, int num_att, bool accumulate) {
  using acc_t = acc_type_t<scalar_t>;
  const int64_t hc = int64_t(heads) * channels;
  const int64_t begin = int64_t(blockIdx.x) * kHeadScoreChunkRows;
  const int64_t end = min(begin + kHeadScoreChunkRows, num_rows);
  for (int64_t j = threadIdx.x; j < hc; j += blockDim.x) {
    const int64_t h = j / channels;
    acc_t att_j[kMaxAtt], part[kMaxAtt];
#pragma unroll
    for (int a = 0; a < kMaxAtt; ++a) {
      att_j[a] = a < num_att ? att[a * hc + j] : acc_t(0);
      part[a] = acc_t(0);
    }
#pragma unroll 4
    for (int64_t n = begin; n < end; ++n) {
      const acc_t v = to_acc(x[n * hc + j]);
      const acc_t* g = grad_score + n * heads + h;
      acc_t dx = acc_t(0);
#pragma unroll
      for (int a = 0; a < kMaxAtt; ++a) {
        if (a >= num_att) break;
        const acc_t ga = g[a * num_rows * heads];
        dx += ga * att_j[a];
        part[a] += ga * v;
      }
      if (grad_x) {
        const scalar_t d = from_acc<scalar_t>(dx);
        grad_x[n * hc + j] = accumulate ? from_acc<scalar_t>(to_acc(grad_x[n * hc + j]) + to_acc(d)) : d;
      }
    }
    if (partials)
      for (int a = 0; a < num_att; ++a) partials[(int64_t(blockIdx.x) * num_att + a) * hc + j] = part[a];
  }
}

// The backward's 16-byte path: a thread owns V = 16 / sizeof(scalar_t) consecutive columns of
// one head (the launcher checked that channels is a multiple of V and that x and grad_x are
// 16-byte aligned) and walks the chunk's rows in order as the column kernel above does, the
// same sums in the same order for each column, with kBackwardRows rows' loads issued first.
// The column kernel loaded 4 bytes a row per thread and, with its per-row `a < num_att`
// branches, one row at a time (SASS): 0.53 ms for ~1 GB on powerlaw-1M-16M (NOTES v13).
template <typename scalar_t>
__global__ void __launch_bounds__(kBackwardMaxThreads)
    head_scores_backward_vec_kernel(const scalar_t* __restrict__ x,
                                    const acc_type_t<scalar_t>* __restrict__ att,
                                    const acc_type_t<scalar_t>* __restrict__ grad_score,
                                    scalar_t* __restrict__ grad_x,
                                    acc_type_t<scalar_t>* __restrict__ partials, int64_t num_rows,
                                    int heads, int channels, int num_att, bool accumulate) {
  using acc_t = acc_type_t<scalar_t>;
  constexpr int V = 16 / sizeof(scalar_t);
  const int64_t hc = int64_t(heads) * channels, pieces = hc / V;
  const int64_t begin = int64_t(blockIdx.x) * kHeadScoreChunkRows;
  const int64_t end = min(begin + kHeadScoreChunkRows, num_rows);
  for (int64_t q = threadIdx.x; q < pieces; q += blockDim.x) {
    const int64_t j0 = q * V, h = j0 / channels;
    acc_t att_j[kMaxAtt][V], part[kMaxAtt][V];
#pragma unroll
    for (int a = 0; a < kMaxAtt; ++a) {
#pragma unroll
      for (int e = 0; e < V; ++e) {
        att_j[a][e] = a < num_att ? att[a * hc + j0 + e] : acc_t(0);
        part[a][e] = acc_t(0);
      }
    }
    for (int64_t n0 = begin; n0 < end; n0 += kBackwardRows) {
      Vec<scalar_t, V> xv[kBackwardRows], old[kBackwardRows];
      acc_t ga[kBackwardRows][kMaxAtt];
#pragma unroll
      for (int r = 0; r < kBackwardRows; ++r) {  // loads first (past the end: row n0 again)
        const int64_t n = n0 + r < end ? n0 + r : n0;
        xv[r] = load_vec<V>(x + n * hc + j0);
        if (accumulate) old[r] = load_vec<V>(grad_x + n * hc + j0);
#pragma unroll
        for (int a = 0; a < kMaxAtt; ++a)  // vectors past num_att: vector 0's entry, unused
          ga[r][a] = grad_score[(int64_t(a < num_att ? a : 0) * num_rows + n) * heads + h];
      }
#pragma unroll
      for (int r = 0; r < kBackwardRows; ++r) {
        if (n0 + r >= end) break;
        Vec<scalar_t, V> dx_out;
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const acc_t v = to_acc(xv[r].v[e]);
          acc_t dx = acc_t(0);
#pragma unroll
          for (int a = 0; a < kMaxAtt; ++a) {
            if (a >= num_att) break;
            dx += ga[r][a] * att_j[a][e];
            part[a][e] += ga[r][a] * v;
          }
          dx_out.v[e] = from_acc<scalar_t>(dx);
          if (accumulate) dx_out.v[e] = from_acc<scalar_t>(to_acc(old[r].v[e]) + to_acc(dx_out.v[e]));
        }
        if (grad_x) store_vec<V>(grad_x + (n0 + r) * hc + j0, dx_out);
      }
    }
    if (partials) {
      for (int a = 0; a < num_att; ++a) {
#pragma unroll
        for (int e = 0; e < V; ++e)
          partials[(int64_t(blockIdx.x) * num_att + a) * hc + j0 + e] = part[a][e];
      }
    }
  }
}

template <typename scalar_t>
void launch_forward(const HeadScoresParams& p, cudaStream_t stream) {
  using acc_t = acc_type_t<scalar_t>;
  const int64_t segments = p.num_rows * p.heads;
  // The pieces head_scores_piece names: V (4, float64 2) elements and any G, or 8 16-bit
  // elements with G = 32 (129 to 256 channels: 17 to 32 pieces).
  constexpr int V = sizeof(scalar_t) == 8 ? 2 : 4;
  const int piece = head_scores_piece(p.scalar_type, p.channels, p.x);
  const int64_t pieces = piece > 0 ? p.channels / piece : 0;
  auto run_vec_v = [&](auto group, auto v) {
    constexpr int G = decltype(group)::value;
    const int64_t groups = kForwardThreads / G;
    const int64_t blocks =
        std::min<int64_t>((segments + groups * kUnroll - 1) / (groups * kUnroll), int64_t(1) << 20);
    head_scores_vec_kernel<scalar_t, G, decltype(v)::value><<<blocks, kForwardThreads, 0, stream>>>(
        static_cast<const scalar_t*>(p.x), static_cast<const acc_t*>(p.att),
        static_cast<acc_t*>(p.score), segments, int(p.heads), int(p.channels), int(p.num_att));
  };
  if constexpr (sizeof(scalar_t) == 2) {
    if (piece == 8) return run_vec_v(std::integral_constant<int, 32>{}, std::integral_constant<int, 8>{});
  }
  if (piece == V) {
    auto run_vec = [&](auto group) { run_vec_v(group, std::integral_constant<int, V>{}); };
    if (pieces <= 1) return run_vec(std::integral_constant<int, 1>{});
    if (pieces <= 2) return run_vec(std::integral_constant<int, 2>{});
    if (pieces <= 4) return run_vec(std::integral_constant<int, 4>{});
    if (pieces <= 8) return run_vec(std::integral_constant<int, 8>{});
    if (pieces <= 16) return run_vec(std::integral_constant<int, 16>{});
    return run_vec(std::integral_constant<int, 32>{});
  }
  auto run = [&](auto group) {
    constexpr int G = decltype(group)::value;
    const int64_t groups = kForwardThreads / G;
    const int64_t blocks = std::min<int64_t>((segments + groups - 1) / groups, int64_t(1) << 20);
    head_scores_kernel<scalar_t, G><<<blocks, kForwardThreads, 0, stream>>>(
        static_cast<const scalar_t*>(p.x), static_cast<const acc_t*>(p.att),
        static_cast<acc_t*>(p.score), segments, int(p.heads), int(p.channels), int(p.num_att));
  };
  if (p.channels <= 4) run(std::integral_constant<int, 4>{});
  else if (p.channels <= 8) run(std::integral_constant<int, 8>{});
  else if (p.channels <= 16) run(std::integral_constant<int, 16>{});
  else run(std::integral_constant<int, 32>{});
}

template <typename scalar_t>
void launch_backward(const HeadScoresBackwardParams& p, cudaStream_t stream) {
  using acc_t = acc_type_t<scalar_t>;
  const int64_t hc = p.heads * p.channels;
  constexpr int V = 16 / sizeof(scalar_t);
  if (vector_width<scalar_t>(p.channels, {}, {p.x, p.grad_x}) == V) {  // grad_x may be null
    const int threads = int(std::min<int64_t>(kBackwardMaxThreads, (hc / V + 31) / 32 * 32));
    head_scores_backward_vec_kernel<scalar_t><<<head_score_chunks(p.num_rows), threads, 0, stream>>>(
        static_cast<const scalar_t*>(p.x), static_cast<const acc_t*>(p.att),
        static_cast<const acc_t*>(p.grad_score), static_cast<scalar_t*>(p.grad_x),
        static_cast<acc_t*>(p.att_partials), p.num_rows, int(p.heads), int(p.channels),
        int(p.num_att), p.grad_x_accumulate && p.grad_x);
    return;
  }
  const int threads = int(std::min<int64_t>(kBackwardMaxThreads, (hc + 31) / 32 * 32));
  head_scores_backward_kernel<scalar_t><<<head_score_chunks(p.num_rows), threads, 0, stream>>>(
      static_cast<const scalar_t*>(p.x), static_cast<const acc_t*>(p.att),
      static_cast<const acc_t*>(p.grad_score), static_cast<scalar_t*>(p.grad_x),
      static_cast<acc_t*>(p.att_partials), p.num_rows, int(p.heads), int(p.channels),
      int(p.num_att), p.grad_x_accumulate && p.grad_x);
}

void check_sizes(int64_t num_att, int64_t heads, int64_t channels, const char* what) {
  GNNIO_CHECK(num_att >= 1 && num_att <= kMaxAtt, ErrorKind::kInvalidArgument, what,
              ": 1 to 4 attention vectors, got ", num_att);
  GNNIO_CHECK(heads * channels < (int64_t(1) << 31), ErrorKind::kInvalidArgument, what,
              ": heads * channels must be below 2^31");
}

}  // namespace

void head_scores_cuda(const HeadScoresParams& p, void* stream) {
  check_sizes(p.num_att, p.heads, p.channels, "head_scores");
  if (p.num_rows == 0 || p.heads == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  if (p.channels == 0) {  // empty dot products
    const size_t elem = p.scalar_type == ScalarType::kFloat64 ? 8 : 4;
    GNNIO_CUDA_CHECK(cudaMemsetAsync(p.score, 0, p.num_rows * p.num_att * p.heads * elem, s));
    return;
  }
  dispatch_cuda(p.scalar_type, IndexType::kInt32,
                [&](auto scalar, auto) { launch_forward<decltype(scalar)>(p, s); });
  GNNIO_CUDA_CHECK(cudaGetLastError());
}

void head_scores_backward_cuda(const HeadScoresBackwardParams& p, void* stream) {
  check_sizes(p.num_att, p.heads, p.channels, "head_scores backward");
  if (p.num_rows == 0 || p.heads * p.channels == 0) return;
  dispatch_cuda(p.scalar_type, IndexType::kInt32, [&](auto scalar, auto) {
    launch_backward<decltype(scalar)>(p, static_cast<cudaStream_t>(stream));
  });
  GNNIO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace gnnio
