#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "gnnio/common/convert.cuh"
#include "gnnio/common/cuda_check.h"
#include "gnnio/common/vec.cuh"
#include "gnnio/reduce/params.h"

namespace gnnio {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

template <typename acc_t>
__device__ inline bool better(acc_t v, acc_t best, ReduceOp op) {
  if (isnan(v)) return !isnan(best);
  return op == ReduceOp::kMax ? v > best : v < best;
}

// Order-preserving 32-bit image of a float (larger value, larger image); NaN goes to the top
// for max and to the bottom for min, so it wins either way, as in the CPU kernel.
__device__ inline uint32_t ordered(float v, ReduceOp op) {
  if (isnan(v)) return op == ReduceOp::kMax ? 0xFFFFFFFFu : 0u;
  if (v == 0.0f) v = 0.0f;  // -0 and +0 compare equal everywhere else: same image, slot decides
  const uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// Packed key: the value image above, the slot below, arranged so that atomicMax (max) or
// atomicMin (min) keeps the extreme value and, among equal values, the lowest slot.
__device__ inline unsigned long long pack(float v, uint32_t slot, ReduceOp op) {
  const unsigned long long hi = static_cast<unsigned long long>(ordered(v, op)) << 32;
  return op == ReduceOp::kMax ? hi | (0xFFFFFFFFu - slot) : hi | slot;
}
__device__ inline uint32_t unpack_slot(unsigned long long key, ReduceOp op) {
  const uint32_t lo = static_cast<uint32_t>(key & 0xFFFFFFFFull);
  return op == ReduceOp::kMax ? 0xFFFFFFFFu - lo : lo;
}

// A weighted slot's candidate: PyG's message w * x rounded once to the element type. torch
// rounds its 16-bit product through float the same way (the float product of two float16 /
// bfloat16 values is exact unless it falls below float's normal range, where both round alike).
template <typename scalar_t>
__device__ inline acc_type_t<scalar_t> message(acc_type_t<scalar_t> w, scalar_t x) {
  return to_acc(from_acc<scalar_t>(mul_pinned(w, to_acc(x))));
}

// Slot k's weight and candidate in a kernel built for kWeighted: unweighted, 1 (unread) and x.
template <bool kWeighted, typename scalar_t>
__device__ inline acc_type_t<scalar_t> slot_weight(const scalar_t* weight, int64_t k) {
  return kWeighted ? to_acc(weight[k]) : acc_type_t<scalar_t>(1);
}
template <bool kWeighted, typename scalar_t>
__device__ inline acc_type_t<scalar_t> candidate(acc_type_t<scalar_t> w, scalar_t x) {
  return kWeighted ? message(w, x) : to_acc(x);
}

// Light rows: one warp per row, each lane V consecutive features (one 16-byte load per slot
// where the layout allows), the row's slots walked in order, two slots in flight at a time.
// kWeighted: the weighted messages (a separate build, so the unweighted kernel is unchanged).
template <typename scalar_t, typename index_t, int V, bool kWeighted>
__global__ void light_kernel(SegmentReduceParams p) {
  using acc_t = acc_type_t<scalar_t>;
  const auto* rowptr = static_cast<const index_t*>(p.rowptr);
  const auto* col = static_cast<const index_t*>(p.col);
  const auto* x = static_cast<const scalar_t*>(p.x);
  const auto* weight = static_cast<const scalar_t*>(p.weight);
  auto* out = static_cast<scalar_t*>(p.out);
  auto* arg = static_cast<index_t*>(p.arg);
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * kWarps;
  for (int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; r < p.num_rows; r += warps) {
    const int64_t begin = rowptr[r], end = rowptr[r + 1];
    if (end - begin > p.split.light_max_degree) continue;  // a heavy row: the tile kernels own it
    for (int64_t f = int64_t(lane) * V; f < p.width; f += 32 * V) {
      scalar_t* out_row = out + r * p.width + f;
      index_t* arg_row = arg + r * p.width + f;
      if (begin == end) {
        for (int i = 0; i < V; ++i) out_row[i] = from_acc<scalar_t>(0.0f), arg_row[i] = index_t(-1);
        continue;
      }
      acc_t best[V];
      int64_t best_k[V];
      {
        const auto v = load_vec<V>(x + int64_t(col[begin]) * p.x_row_stride + f);
        const acc_t w = slot_weight<kWeighted>(weight, begin);
        for (int i = 0; i < V; ++i) best[i] = candidate<kWeighted>(w, v.v[i]), best_k[i] = begin;
      }
      auto update = [&](const Vec<scalar_t, V>& v, acc_t w, int64_t k) {
        for (int i = 0; i < V; ++i) {
          const acc_t a = candidate<kWeighted>(w, v.v[i]);
          if (better<acc_t>(a, best[i], p.op)) best[i] = a, best_k[i] = k;
        }
      };
      int64_t k = begin + 1;
      for (; k + 1 < end; k += 2) {
        // The weights first: independent of col, their loads overlap the gather's.
        const acc_t w0 = slot_weight<kWeighted>(weight, k), w1 = slot_weight<kWeighted>(weight, k + 1);
        const auto v0 = load_vec<V>(x + int64_t(col[k]) * p.x_row_stride + f);
        const auto v1 = load_vec<V>(x + int64_t(col[k + 1]) * p.x_row_stride + f);
        update(v0, w0, k);
        update(v1, w1, k + 1);
      }
      if (k < end)
        update(load_vec<V>(x + int64_t(col[k]) * p.x_row_stride + f), slot_weight<kWeighted>(weight, k), k);
      // acc_t holds every scalar_t exactly, so the stored maximum is the input value (or the
      // rounded product) itself.
      for (int i = 0; i < V; ++i)
        out_row[i] = from_acc<scalar_t>(best[i]), arg_row[i] = static_cast<index_t>(best_k[i]);
    }
  }
}

// Heavy rows: block b reduces work item b (a chunk of one heavy row's slots) for a 32-feature
// tile (blockIdx.y); its warps split the chunk, each lane keeps one feature's best, the block
// merges warps in shared memory, then one 64-bit atomic per feature merges blocks exactly.
template <typename scalar_t, typename index_t, bool kWeighted>
__global__ void heavy_tile_kernel(SegmentReduceParams p, unsigned long long* keys) {
  using acc_t = acc_type_t<scalar_t>;
  __shared__ acc_t best_v[kWarps][32];
  __shared__ int64_t best_k[kWarps][32];
  const auto* col = static_cast<const index_t*>(p.col);
  const auto* x = static_cast<const scalar_t*>(p.x);
  const auto* weight = static_cast<const scalar_t*>(p.weight);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t item = blockIdx.x;
  const int64_t heavy = p.split.heavy_items[item * 3], begin = p.split.heavy_items[item * 3 + 1],
                end = p.split.heavy_items[item * 3 + 2];
  const int64_t f = int64_t(blockIdx.y) * 32 + lane;
  acc_t v_best = 0;
  int64_t k_best = -1;
  if (f < p.width) {
    for (int64_t k = begin + warp; k < end; k += kWarps) {
      // The weight's load is issued before the gather's, not after it (one chain per slot).
      const acc_t w = slot_weight<kWeighted>(weight, k);
      const acc_t v = candidate<kWeighted>(w, x[int64_t(col[k]) * p.x_row_stride + f]);
      if (k_best < 0 || better(v, v_best, p.op)) v_best = v, k_best = k;
    }
  }
  best_v[warp][lane] = v_best;
  best_k[warp][lane] = k_best;
  __syncthreads();
  if (warp == 0 && f < p.width) {
    for (int w = 1; w < kWarps; ++w) {  // fixed order; equal values keep the lower slot
      const int64_t k = best_k[w][lane];
      if (k < 0) continue;
      const acc_t v = best_v[w][lane];
      // Equal values (neither better) keep the lower slot, as a sequential walk would.
      if (k_best < 0 || better(v, v_best, p.op) || (!better(v_best, v, p.op) && k < k_best))
        v_best = v, k_best = k;
    }
    if (k_best >= 0) {
      unsigned long long* key = keys + heavy * p.width + f;
      const unsigned long long packed = pack(float(v_best), static_cast<uint32_t>(k_best), p.op);
      if (p.op == ReduceOp::kMax) atomicMax(key, packed); else atomicMin(key, packed);
    }
  }
}

template <typename scalar_t, typename index_t>
__global__ void heavy_finalize_kernel(SegmentReduceParams p, const unsigned long long* keys) {
  const auto* col = static_cast<const index_t*>(p.col);
  const auto* x = static_cast<const scalar_t*>(p.x);
  const auto* weight = static_cast<const scalar_t*>(p.weight);
  auto* out = static_cast<scalar_t*>(p.out);
  auto* arg = static_cast<index_t*>(p.arg);
  const int64_t n = p.split.num_heavy * p.width;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t h = i / p.width, f = i % p.width, r = p.split.heavy_rows[h];
    const int64_t slot = unpack_slot(keys[i], p.op);
    // The winner's candidate again, the same rounding: exact, any dtype.
    const scalar_t xv = x[int64_t(col[slot]) * p.x_row_stride + f];
    out[r * p.width + f] =
        from_acc<scalar_t>(weight != nullptr ? message(to_acc(weight[slot]), xv) : to_acc(xv));
    arg[r * p.width + f] = static_cast<index_t>(slot);
  }
}

__global__ void fill_keys_kernel(unsigned long long* keys, int64_t n, unsigned long long value) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    keys[i] = value;
}

// Backward: one warp per source row of the transpose, each lane V features; the arg row of
// each destination is read as vectors, the gradient only where this slot won (times the
// transposed slot's weight: read in order, beside col_t and t2c).
template <typename scalar_t, typename index_t, int V, bool kWeighted>
__global__ void backward_kernel(SegmentReduceBackwardParams p) {
  using acc_t = acc_type_t<scalar_t>;
  const auto* rowptr_t = static_cast<const index_t*>(p.rowptr_t);
  const auto* col_t = static_cast<const index_t*>(p.col_t);
  const auto* t2c = static_cast<const index_t*>(p.t2c);
  const auto* arg = static_cast<const index_t*>(p.arg);
  const auto* weight = static_cast<const scalar_t*>(p.weight);
  const auto* g = static_cast<const scalar_t*>(p.grad_out);
  auto* gx = static_cast<scalar_t*>(p.grad_x);
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * kWarps;
  for (int64_t j = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; j < p.num_src; j += warps) {
    if (rowptr_t[j + 1] - rowptr_t[j] > p.split.light_max_degree) continue;  // heavy: tiles own it
    for (int64_t f = int64_t(lane) * V; f < p.width; f += 32 * V) {
      acc_t acc[V] = {};
      for (int64_t k = rowptr_t[j]; k < rowptr_t[j + 1]; ++k) {
        const int64_t r = col_t[k];
        const index_t slot = t2c[k];
        const acc_t w = slot_weight<kWeighted>(weight, k);
        const auto won = load_vec<V>(arg + r * p.width + f);
        for (int i = 0; i < V; ++i)
          if (won.v[i] == slot)
            acc[i] += kWeighted ? mul_pinned(w, to_acc(g[r * p.width + f + i])) : to_acc(g[r * p.width + f + i]);
      }
      for (int i = 0; i < V; ++i) gx[j * p.width + f + i] = from_acc<scalar_t>(acc[i]);
    }
  }
}

// Backward, heavy sources: block b sums work item b (a chunk of one heavy source's transposed
// slots) for a 32-feature tile; warps split the chunk and are added in warp order.
template <typename scalar_t, typename index_t>
__global__ void backward_heavy_tile_kernel(SegmentReduceBackwardParams p, acc_type_t<scalar_t>* partial) {
  using acc_t = acc_type_t<scalar_t>;
  __shared__ acc_t sums[kWarps][32];
  const auto* col_t = static_cast<const index_t*>(p.col_t);
  const auto* t2c = static_cast<const index_t*>(p.t2c);
  const auto* arg = static_cast<const index_t*>(p.arg);
  const auto* weight = static_cast<const scalar_t*>(p.weight);
  const auto* g = static_cast<const scalar_t*>(p.grad_out);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t item = blockIdx.x;
  const int64_t begin = p.split.heavy_items[item * 3 + 1], end = p.split.heavy_items[item * 3 + 2];
  const int64_t f = int64_t(blockIdx.y) * 32 + lane;
  acc_t acc = 0;
  if (f < p.width) {
    for (int64_t k = begin + warp; k < end; k += kWarps) {
      const int64_t r = col_t[k];
      const index_t slot = t2c[k];
      if (arg[r * p.width + f] == slot)
        acc += weight != nullptr ? mul_pinned(to_acc(weight[k]), to_acc(g[r * p.width + f]))
                                 : to_acc(g[r * p.width + f]);
    }
  }
  sums[warp][lane] = acc;
  __syncthreads();
  if (warp == 0 && f < p.width) {
    for (int w = 1; w < kWarps; ++w) acc += sums[w][lane];
    partial[item * p.width + f] = acc;
  }
}

// One thread per (first item of a heavy source, feature): adds that source's partials in order.
template <typename scalar_t>
__global__ void backward_heavy_finalize_kernel(SegmentReduceBackwardParams p,
                                               const acc_type_t<scalar_t>* partial) {
  using acc_t = acc_type_t<scalar_t>;
  auto* gx = static_cast<scalar_t*>(p.grad_x);
  const int64_t n = p.split.num_items * p.width;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t item = i / p.width, f = i % p.width;
    const int64_t owner = p.split.heavy_items[item * 3];
    if (item > 0 && p.split.heavy_items[(item - 1) * 3] == owner) continue;  // not the owner's first
    acc_t acc = 0;
    for (int64_t it = item; it < p.split.num_items && p.split.heavy_items[it * 3] == owner; ++it)
      acc += partial[it * p.width + f];
    gx[p.split.heavy_rows[owner] * p.width + f] = from_acc<scalar_t>(acc);
  }
}

// The weights' gradient: one thread per destination row walks its features in order and adds
// each won feature's g * x to its slot's entry. A row owns its slots, so no atomics, and the
// order and roundings are the CPU kernel's. Work per row is its width, not its degree: a hub
// costs no more than any row. Reads are row-strided across a warp; this runs only when a
// weight needs a gradient.
template <typename scalar_t, typename index_t>
__global__ void weight_grad_kernel(SegmentReduceWeightGradParams p) {
  using acc_t = acc_type_t<scalar_t>;
  const auto* col = static_cast<const index_t*>(p.col);
  const auto* arg = static_cast<const index_t*>(p.arg);
  const auto* x = static_cast<const scalar_t*>(p.x);
  const auto* g = static_cast<const scalar_t*>(p.grad_out);
  auto* gw = static_cast<acc_t*>(p.grad_weight);
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < p.num_rows;
       r += int64_t(gridDim.x) * blockDim.x) {
    for (int64_t f = 0; f < p.width; ++f) {
      const int64_t k = arg[r * p.width + f];
      if (k < 0) continue;
      gw[k] += mul_pinned(to_acc(g[r * p.width + f]), to_acc(x[int64_t(col[k]) * p.x_row_stride + f]));
    }
  }
}

int blocks_for(int64_t threads_needed) {
  const int64_t b = (threads_needed + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > (1 << 20) ? (1 << 20) : b));
}

}  // namespace

size_t segment_reduce_cuda_workspace_bytes(const SegmentReduceParams& p) {
  return static_cast<size_t>(p.split.num_heavy * p.width) * sizeof(unsigned long long);
}

void segment_reduce_cuda(const SegmentReduceParams& p, void* workspace, void* stream) {
  if (p.num_rows == 0 || p.width == 0) return;
  GNNIO_CHECK(p.split.num_heavy == 0 || p.nnz < (int64_t(1) << 32), ErrorKind::kInternal,
              "segment_reduce_cuda: heavy tiles pack slots in 32 bits (nnz < 2^32)");
  // The packed key holds a 32-bit value image: exact for float32 / float16 / bfloat16 only.
  GNNIO_CHECK(p.split.num_heavy == 0 || p.scalar_type != ScalarType::kFloat64, ErrorKind::kInternal,
              "segment_reduce_cuda: float64 runs the light kernel only (no heavy tiles)");
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_cuda(p.scalar_type, p.index_type, [&](auto scalar, auto index) {
    using scalar_t = decltype(scalar);
    using index_t = decltype(index);
    constexpr int kVec = 16 / sizeof(scalar_t);
    const bool vec = vector_width<scalar_t>(p.width, {p.x_row_stride}, {p.x, p.out}) > 1;
    const int blocks = blocks_for(p.num_rows * 32);
    if (p.weight != nullptr) {
      if (vec) light_kernel<scalar_t, index_t, kVec, true><<<blocks, kThreads, 0, s>>>(p);
      else light_kernel<scalar_t, index_t, 1, true><<<blocks, kThreads, 0, s>>>(p);
    } else {
      if (vec) light_kernel<scalar_t, index_t, kVec, false><<<blocks, kThreads, 0, s>>>(p);
      else light_kernel<scalar_t, index_t, 1, false><<<blocks, kThreads, 0, s>>>(p);
    }
    GNNIO_CUDA_CHECK(cudaGetLastError());
    if (p.split.num_heavy == 0) return;
    auto* keys = static_cast<unsigned long long*>(workspace);
    const int64_t n = p.split.num_heavy * p.width;
    fill_keys_kernel<<<blocks_for(n), kThreads, 0, s>>>(
        keys, n, p.op == ReduceOp::kMax ? 0ull : ~0ull);
    const dim3 grid(static_cast<unsigned>(p.split.num_items), static_cast<unsigned>((p.width + 31) / 32));
    if (p.weight != nullptr) heavy_tile_kernel<scalar_t, index_t, true><<<grid, kThreads, 0, s>>>(p, keys);
    else heavy_tile_kernel<scalar_t, index_t, false><<<grid, kThreads, 0, s>>>(p, keys);
    heavy_finalize_kernel<scalar_t, index_t><<<blocks_for(n), kThreads, 0, s>>>(p, keys);
    GNNIO_CUDA_CHECK(cudaGetLastError());
  });
}

size_t segment_reduce_backward_cuda_workspace_bytes(const SegmentReduceBackwardParams& p) {
  const size_t acc = p.scalar_type == ScalarType::kFloat64 ? sizeof(double) : sizeof(float);
  return static_cast<size_t>(p.split.num_items * p.width) * acc;
}

void segment_reduce_backward_cuda(const SegmentReduceBackwardParams& p, void* workspace, void* stream) {
  if (p.num_src == 0 || p.width == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_cuda(p.scalar_type, p.index_type, [&](auto scalar, auto index) {
    using scalar_t = decltype(scalar);
    using index_t = decltype(index);
    constexpr int kVec = 16 / sizeof(scalar_t);
    const bool arg_aligned = reinterpret_cast<uintptr_t>(p.arg) % (kVec * sizeof(index_t)) == 0;
    const int vec = vector_width<scalar_t>(p.width, {}, {p.grad_out, p.grad_x});
    const int blocks = blocks_for(p.num_src * 32);
    if (p.weight != nullptr) {
      if (vec > 1 && arg_aligned) backward_kernel<scalar_t, index_t, kVec, true><<<blocks, kThreads, 0, s>>>(p);
      else backward_kernel<scalar_t, index_t, 1, true><<<blocks, kThreads, 0, s>>>(p);
    } else {
      if (vec > 1 && arg_aligned) backward_kernel<scalar_t, index_t, kVec, false><<<blocks, kThreads, 0, s>>>(p);
      else backward_kernel<scalar_t, index_t, 1, false><<<blocks, kThreads, 0, s>>>(p);
    }
    GNNIO_CUDA_CHECK(cudaGetLastError());
    if (p.split.num_items == 0) return;
    auto* partial = static_cast<acc_type_t<scalar_t>*>(workspace);
    const dim3 grid(static_cast<unsigned>(p.split.num_items), static_cast<unsigned>((p.width + 31) / 32));
    backward_heavy_tile_kernel<scalar_t, index_t><<<grid, kThreads, 0, s>>>(p, partial);
    backward_heavy_finalize_kernel<scalar_t><<<blocks_for(p.split.num_items * p.width), kThreads, 0, s>>>(p, partial);
    GNNIO_CUDA_CHECK(cudaGetLastError());
  });
}

void segment_reduce_weight_grad_cuda(const SegmentReduceWeightGradParams& p, void* stream) {
  if (p.num_rows == 0 || p.width == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_cuda(p.scalar_type, p.index_type, [&](auto scalar, auto index) {
    weight_grad_kernel<decltype(scalar), decltype(index)><<<blocks_for(p.num_rows), kThreads, 0, s>>>(p);
    GNNIO_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace gnnio
