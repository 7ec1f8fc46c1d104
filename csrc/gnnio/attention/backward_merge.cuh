// Row helpers and the merge kernels of the attention backward (included through backward_common.cuh
// by cuda_backward.cu and cuda_backward_pass_b.cu; each object keeps its own merge instances).
//
// A heavy row of either CSR is split into work items; each item leaves its partial sums in the
// workspace and one block per (heavy row, head) adds them in a fixed tree (lane group q takes
// items q, q + G, ..., then group 0 adds the G sums in group order): the same bits every run.
#pragma once

#include "gnnio/attention/score.cuh"

namespace gnnio {
namespace attention_detail {

// Partial sums of a work item, per head: a scalar (GAT score gradient) then two C-vectors; for
// pass A with delta_in_pass_a, OnlineSlot's layout instead.
struct Partials {
  float* base = nullptr;  // [num_items, H, 1 + 2C]
  int64_t stride = 0;     // 1 + 2C
};

// Pass A's item partials when it forms D_i itself: the item's shift (where its walk left it:
// the running p-weighted mean r g of its slots), sum of p, sum of p (r g - shift), then the
// four C-vectors A_q, B_q, A_att, B_att (see pass_a_kernel), so an item's share of d query is
// A_q - (D - shift) B_q once D is known.
struct OnlineSlot {
  static constexpr int kShift = 0, kWeight = 1, kDelta = 2, kVectors = 3;
  static constexpr int64_t stride(int64_t C) { return kVectors + 4 * C; }
};

template <int L, int CPL>
__device__ inline void store_acc_row(float* dst, const Group<L>& g, int64_t C, const float (&v)[CPL]) {
#pragma unroll
  for (int t = 0; t < CPL; ++t) {
    const int64_t c = int64_t(g.sub) * CPL + t;
    if (c < C) dst[c] = v[t];
  }
}

template <typename scalar_t, int L, int CPL>
__device__ inline void store_row(void* dst_v, int64_t offset, const Group<L>& g, int64_t C, bool vec,
                                 const float (&v)[CPL]) {
  if (dst_v)
    store_channels<scalar_t, CPL>(static_cast<scalar_t*>(dst_v) + offset, int64_t(g.sub) * CPL, C, vec, v);
}

template <typename scalar_t, int L, int CPL>
__device__ inline void load_row(const void* src_v, int64_t offset, const Group<L>& g, int64_t C,
                                bool vec, float (&v)[CPL]) {
  load_channels<scalar_t, CPL>(static_cast<const scalar_t*>(src_v) + offset, int64_t(g.sub) * CPL, C, vec, v);
}

// split.item_offsets must be set (fill_item_offsets) for both merge kernels.
//
// One block per (heavy row, head) adds the row's work items: lane group q sums items q, q + G,
// ..., then group 0 adds the G sums in group order (a fixed tree: the same bits every run). It
// writes the row's three outputs: a scalar (scalar_t) and two C-vectors (the first as scalar_t,
// the second as scalar_t or, with second_is_acc, as float: GATv2's d att partial, at row
// acc_row_base + heavy index when acc_row_base >= 0 (per-block d att), else at the row's own).
// Blocks of kMergeThreads (score.cuh). __launch_bounds__ keeps the fp32 CPL-8 layout at <= 128
// registers, 4 blocks per SM (reading the item table had tipped it to 130, 1 block of 256, without
// bounds), and the CPL-4 ones at <= 80, 6 blocks per SM (70-72 registers; L = 32 spilled 40
// bytes at 72).
template <typename scalar_t, int L, int CPL>
__global__ void __launch_bounds__(kMergeThreads, CPL >= 8 ? 4 : 6)
    merge_kernel(RowSplit split, Partials part, int64_t H, int64_t C, bool vec, void* scalar_out,
                 void* first_out, void* second_out, bool second_is_acc, int64_t acc_row_base) {
  extern __shared__ float shared[];  // [G][1 + 2C]
  constexpr int G = kMergeThreads / L;
  const Group<L> g;
  const int q = threadIdx.x / L;
  const int64_t hi = blockIdx.x / H, h = blockIdx.x % H;
  const int64_t first = split.item_offsets[hi], last = split.item_offsets[hi + 1];
  float sc = 0.0f, a[CPL] = {}, b2[CPL] = {};
  for (int64_t it0 = first + q; it0 < last; it0 += kMergeBatch * G) {
    float sb[kMergeBatch], ab[kMergeBatch][CPL], bb[kMergeBatch][CPL];
#pragma unroll
    for (int u = 0; u < kMergeBatch; ++u) {  // loads first (past the end: the first item again)
      const int64_t it = it0 + int64_t(u) * G;
      const float* slot = part.base + ((it < last ? it : first) * H + h) * part.stride;
      sb[u] = slot[0];
#pragma unroll
      for (int t = 0; t < CPL; ++t) {
        const int64_t c = int64_t(g.sub) * CPL + t;
        ab[u][t] = c < C ? slot[1 + c] : 0.0f;
        bb[u][t] = c < C ? slot[1 + C + c] : 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kMergeBatch; ++u) {
      if (it0 + int64_t(u) * G >= last) break;
      sc += sb[u];
#pragma unroll
      for (int t = 0; t < CPL; ++t) {
        const int64_t c = int64_t(g.sub) * CPL + t;
        if (c < C) a[t] += ab[u][t], b2[t] += bb[u][t];
      }
    }
  }
  float* mine = shared + q * part.stride;
  if (g.sub == 0) mine[0] = sc;
#pragma unroll
  for (int t = 0; t < CPL; ++t) {
    const int64_t c = int64_t(g.sub) * CPL + t;
    if (c < C) mine[1 + c] = a[t], mine[1 + C + c] = b2[t];
  }
  __syncthreads();
  if (q != 0) return;
  for (int w = 1; w < G; ++w) {
    const float* other = shared + w * part.stride;
    sc += other[0];
#pragma unroll
    for (int t = 0; t < CPL; ++t) {
      const int64_t c = int64_t(g.sub) * CPL + t;
      if (c < C) a[t] += other[1 + c], b2[t] += other[1 + C + c];
    }
  }
  const int64_t row = split.heavy_rows[hi];
  if (scalar_out && g.sub == 0) static_cast<scalar_t*>(scalar_out)[row * H + h] = from_acc<scalar_t>(sc);
  store_row<scalar_t, L, CPL>(first_out, (row * H + h) * C, g, C, vec, a);
  if (second_is_acc) {
    const int64_t acc_row = acc_row_base >= 0 ? acc_row_base + hi : row;
    if (second_out) store_acc_row(static_cast<float*>(second_out) + (acc_row * H + h) * C, g, C, b2);
  } else {
    store_row<scalar_t, L, CPL>(second_out, (row * H + h) * C, g, C, vec, b2);
  }
}

// merge_kernel for pass A's OnlineSlot partials of a heavy row (delta_in_pass_a): first D_i of
// the row, summed relative to the first item's shift (so that the sum is of small terms when the
// row's r g are alike, as the per-slot r g - D of the other path), then each item's
// A - (D - shift_t) B, added in the same fixed tree. Writes d query (scalar_t), the d att share
// (float, at row acc_row_base + heavy index when acc_row_base >= 0) and D_i (float). Blocks of
// kMergeThreads; the fp32 CPL-4 layouts take 108-116 registers (4 blocks per SM; 2 of 256).
template <typename scalar_t, int L, int CPL>
__global__ void __launch_bounds__(kMergeThreads, CPL >= 8 ? 2 : 4)
    merge_online_kernel(RowSplit split, Partials part, int64_t H, int64_t C, bool vec,
                        void* grad_query, float* att_partial, int64_t acc_row_base, float* delta) {
  extern __shared__ float shared[];  // [G][2] scalars, then (reused) [G][2C]
  constexpr int G = kMergeThreads / L;
  using S = OnlineSlot;
  const Group<L> g;
  const int q = threadIdx.x / L;
  const int64_t hi = blockIdx.x / H, h = blockIdx.x % H;
  const int64_t first = split.item_offsets[hi], last = split.item_offsets[hi + 1];
  const float shift0 = part.base[(first * H + h) * part.stride + S::kShift];
  float rel = 0.0f, wsum = 0.0f;  // sum of p (r g - shift0), sum of p
  for (int64_t it0 = first + q; it0 < last; it0 += kMergeBatch * G) {
    float sh[kMergeBatch], wt[kMergeBatch], dl[kMergeBatch];
#pragma unroll
    for (int u = 0; u < kMergeBatch; ++u) {
      const int64_t it = it0 + int64_t(u) * G;
      const float* slot = part.base + ((it < last ? it : first) * H + h) * part.stride;
      sh[u] = slot[S::kShift], wt[u] = slot[S::kWeight], dl[u] = slot[S::kDelta];
    }
#pragma unroll
    for (int u = 0; u < kMergeBatch; ++u) {
      if (it0 + int64_t(u) * G >= last) break;
      rel += dl[u] + (sh[u] - shift0) * wt[u];
      wsum += wt[u];
    }
  }
  if (g.sub == 0) shared[2 * q] = rel, shared[2 * q + 1] = wsum;
  __syncthreads();
  rel = wsum = 0.0f;
  for (int w = 0; w < G; ++w) rel += shared[2 * w], wsum += shared[2 * w + 1];
  __syncthreads();  // shared is reused below
  // D - shift0, without forming D first (D can be large and the row's r g alike).
  const float d_rel = rel + shift0 * (wsum - 1.0f);
  float a[CPL] = {}, b2[CPL] = {};
  for (int64_t it0 = first + q; it0 < last; it0 += kMergeBatch * G) {
    float corr[kMergeBatch], vb[kMergeBatch][4][CPL];
#pragma unroll
    for (int u = 0; u < kMergeBatch; ++u) {  // loads first (past the end: the first item again)
      const int64_t it = it0 + int64_t(u) * G;
      const float* slot = part.base + ((it < last ? it : first) * H + h) * part.stride;
      corr[u] = d_rel + (shift0 - slot[S::kShift]);  // D - shift_t
#pragma unroll
      for (int x = 0; x < 4; ++x)
#pragma unroll
        for (int t = 0; t < CPL; ++t) {
          const int64_t c = int64_t(g.sub) * CPL + t;
          vb[u][x][t] = c < C ? slot[S::kVectors + x * C + c] : 0.0f;
        }
    }
#pragma unroll
    for (int u = 0; u < kMergeBatch; ++u) {
      if (it0 + int64_t(u) * G >= last) break;
#pragma unroll
      for (int t = 0; t < CPL; ++t) {
        const int64_t c = int64_t(g.sub) * CPL + t;
        if (c < C) {
          a[t] += vb[u][0][t] - corr[u] * vb[u][1][t];
          b2[t] += vb[u][2][t] - corr[u] * vb[u][3][t];
        }
      }
    }
  }
  float* mine = shared + q * 2 * C;
#pragma unroll
  for (int t = 0; t < CPL; ++t) {
    const int64_t c = int64_t(g.sub) * CPL + t;
    if (c < C) mine[c] = a[t], mine[C + c] = b2[t];
  }
  __syncthreads();
  if (q != 0) return;
  for (int w = 1; w < G; ++w) {
    const float* other = shared + w * 2 * C;
#pragma unroll
    for (int t = 0; t < CPL; ++t) {
      const int64_t c = int64_t(g.sub) * CPL + t;
      if (c < C) a[t] += other[c], b2[t] += other[C + c];
    }
  }
  const int64_t row = split.heavy_rows[hi];
  store_row<scalar_t, L, CPL>(grad_query, (row * H + h) * C, g, C, vec, a);
  const int64_t acc_row = acc_row_base >= 0 ? acc_row_base + hi : row;
  if (att_partial) store_acc_row(att_partial + (acc_row * H + h) * C, g, C, b2);
  if (delta && g.sub == 0) delta[row * H + h] = shift0 + d_rel;
}

}  // namespace attention_detail
}  // namespace gnnio
