// Device pieces shared by the attention kernels: the lane layout of a (row, head) task, the
// three scores with what their backward needs, and the merge of partial online-softmax states.
//
// Layout: a group of L lanes (8, 16 or 32; several groups per warp when channels are few) owns
// one (row, head) task; lane `sub` holds channels c = sub + L * t for t < CPL, so the L lanes
// read L consecutive channels of a feature row per step (coalesced).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "gnnio/attention/dropout.h"
#include "gnnio/attention/params.h"
#include "gnnio/common/convert.cuh"

namespace gnnio::attention_detail {

constexpr int kThreads = 256;
constexpr float kSoftmaxEps = 1e-16f;

template <int L>
struct Group {
  int sub;        // lane within the group
  unsigned mask;  // the group's lanes in the warp
  __device__ Group() {
    const int lane = threadIdx.x % 32;
    sub = lane % L;
    mask = L == 32 ? 0xFFFFFFFFu : (((1u << L) - 1u) << (lane / L * L));
  }
  __device__ float sum(float v) const {
#pragma unroll
    for (int o = L / 2; o > 0; o >>= 1) v += __shfl_xor_sync(mask, v, o, L);
    return v;
  }
};

template <typename acc_t>
__device__ inline acc_t leaky(acc_t v, acc_t slope) { return v > acc_t(0) ? v : v * slope; }

// Per-task constants: the destination-side operands of row i, head h, kept in registers.
template <typename scalar_t, int CPL>
struct DstSide {
  float q[CPL];    // query (GATv2 / dot), 0 beyond C
  float att[CPL];  // att (GATv2)
  float score;     // dst_score (GAT)

  __device__ void load(const AttentionParams& p, int64_t i, int64_t h, int sub, int L) {
    const auto* query = static_cast<const scalar_t*>(p.query);
    const auto* a = static_cast<const scalar_t*>(p.att);
    const auto* ds = static_cast<const scalar_t*>(p.dst_score);
#pragma unroll
    for (int t = 0; t < CPL; ++t) {
      const int64_t c = sub + int64_t(L) * t;
      const bool ok = c < p.channels;
      q[t] = ok && query ? to_acc(query[(i * p.heads + h) * p.channels + c]) : 0.0f;
      att[t] = ok && a ? to_acc(a[h * p.channels + c]) : 0.0f;
    }
    score = ds ? to_acc(ds[i * p.heads + h]) : 0.0f;
  }
};

// The source-side inputs of slot k's score, loaded apart from the arithmetic so that a kernel
// can issue the loads of several slots before the first reduction: GAT's two scalars (raw[0]),
// or key_j + edge_key_k per channel.
template <typename scalar_t, int L, int CPL>
__device__ inline void load_key(const AttentionParams& p, const Group<L>& g, int64_t j, int64_t k,
                                int64_t h, float (&kk)[CPL]) {
  const int64_t H = p.heads, C = p.channels;
  if (p.kind == ScoreKind::kGat) {
    const auto* ss = static_cast<const scalar_t*>(p.src_score);
    const auto* es = static_cast<const scalar_t*>(p.edge_score);
    kk[0] = to_acc(ss[j * H + h]) + (es ? to_acc(es[k * H + h]) : 0.0f);
    return;
  }
  const auto* key = static_cast<const scalar_t*>(p.key) + (j * H + h) * C;
  const auto* ek = p.edge_key ? static_cast<const scalar_t*>(p.edge_key) + (k * H + h) * C : nullptr;
#pragma unroll
  for (int t = 0; t < CPL; ++t) {
    const int64_t c = g.sub + int64_t(L) * t;
    kk[t] = c < C ? to_acc(key[c]) + (ek ? to_acc(ek[c]) : 0.0f) : 0.0f;
  }
}

// e of a slot from its loaded key. z keeps what the backward differentiates through: the
// pre-activation (GAT: z[0]; GATv2: per channel) or the key + edge key (dot).
template <typename scalar_t, int L, int CPL>
__device__ inline float score_of(const AttentionParams& p, const Group<L>& g,
                                 const DstSide<scalar_t, CPL>& d, const float (&kk)[CPL],
                                 float (&z)[CPL]) {
  const float slope = static_cast<float>(p.negative_slope);
  if (p.kind == ScoreKind::kGat) {
    z[0] = kk[0] + d.score;
    return leaky(z[0], slope);
  }
  float part = 0.0f;
#pragma unroll
  for (int t = 0; t < CPL; ++t) {
    if (p.kind == ScoreKind::kGatV2) {
      z[t] = kk[t] + d.q[t];
      part += d.att[t] * leaky(z[t], slope);
    } else {
      z[t] = kk[t];
      part += d.q[t] * kk[t];
    }
  }
  const float e = g.sum(part);
  return p.kind == ScoreKind::kDot ? e * static_cast<float>(p.scale) : e;
}

// e of slot k (edge j -> i, head h), loads and arithmetic together.
template <typename scalar_t, int L, int CPL>
__device__ inline float edge_score(const AttentionParams& p, const Group<L>& g,
                                   const DstSide<scalar_t, CPL>& d, int64_t j, int64_t k,
                                   int64_t h, float (&z)[CPL]) {
  float kk[CPL];
  load_key<scalar_t, L, CPL>(p, g, j, k, h, kk);
  return score_of<scalar_t, L, CPL>(p, g, d, kk, z);
}

// value_j + edge_value_k for this lane's channels.
template <typename scalar_t, int L, int CPL>
__device__ inline void load_value(const AttentionParams& p, const Group<L>& g, int64_t j,
                                  int64_t k, int64_t h, float (&v)[CPL]) {
  const int64_t H = p.heads, C = p.channels;
  const auto* val = static_cast<const scalar_t*>(p.value) + (j * H + h) * C;
  const auto* ev = p.edge_value ? static_cast<const scalar_t*>(p.edge_value) + (k * H + h) * C : nullptr;
#pragma unroll
  for (int t = 0; t < CPL; ++t) {
    const int64_t c = g.sub + int64_t(L) * t;
    v[t] = c < C ? to_acc(val[c]) + (ev ? to_acc(ev[c]) : 0.0f) : 0.0f;
  }
}

// Dropout factor of slot k, head h: 1/(1-p) if kept, else 0 (1 without dropout).
__device__ inline float dropout_factor(const AttentionParams& p, int64_t k, int64_t h) {
  if (p.dropout <= 0.0) return 1.0f;
  return dropout_keep(p.seed, k, h, p.heads, p.dropout) ? static_cast<float>(1.0 / (1.0 - p.dropout)) : 0.0f;
}

// First work item of heavy row `owner` (items are sorted by owner): a lower-bound search.
__device__ inline int64_t first_item(const RowSplit& s, int64_t owner) {
  int64_t lo = 0, hi = s.num_items;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (s.heavy_items[mid * 3] < owner) lo = mid + 1; else hi = mid;
  }
  return lo;
}

inline int blocks_for(int64_t threads) {
  const int64_t b = (threads + kThreads - 1) / kThreads;
  return static_cast<int>(b < 1 ? 1 : (b > (1 << 30) ? (1 << 30) : b));
}

// Calls fn(std::integral_constant<int, L>, std::integral_constant<int, CPL>) for the layout
// the planner picks from the channel count: the smallest group that covers C in one step up to
// 32 lanes, then up to 8 channels per lane (C <= 256).
template <typename Fn>
void dispatch_layout(int64_t channels, Fn&& fn) {
  if (channels <= 8) return fn(std::integral_constant<int, 8>{}, std::integral_constant<int, 1>{});
  if (channels <= 16) return fn(std::integral_constant<int, 16>{}, std::integral_constant<int, 1>{});
  if (channels <= 32) return fn(std::integral_constant<int, 32>{}, std::integral_constant<int, 1>{});
  if (channels <= 64) return fn(std::integral_constant<int, 32>{}, std::integral_constant<int, 2>{});
  if (channels <= 128) return fn(std::integral_constant<int, 32>{}, std::integral_constant<int, 4>{});
  return fn(std::integral_constant<int, 32>{}, std::integral_constant<int, 8>{});
}

constexpr int64_t kMaxCudaChannels = 256;

}  // namespace gnnio::attention_detail
