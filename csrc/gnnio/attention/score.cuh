// Device pieces shared by the attention kernels: the lane layout of a (row, head) task, the
// three scores with what their backward needs, and the merge of partial online-softmax states.
//
// Layout: a group of L lanes owns one (row, head) task and lane `sub` holds the CPL consecutive
// channels c = sub * CPL + t (t < CPL), CPL 4 (16 bytes of float32, 8 of 16-bit) up to 128. A head
// of 32 float32 channels is 8 lanes, so a warp covers 4 heads of one row (512 contiguous bytes
// of a feature row per slot) or, with one head, 4 rows: few channels or small degrees do not
// leave lanes idle.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "gnnio/attention/dropout.h"
#include "gnnio/attention/params.h"
#include "gnnio/common/cache_hint.cuh"
#include "gnnio/common/convert.cuh"
#include "gnnio/common/cuda_check.h"
#include "gnnio/common/item_offsets.cuh"
#include "gnnio/common/vec.cuh"
#include "gnnio/common/workspace.h"

namespace gnnio::attention_detail {

constexpr int kThreads = 256;
// Work items a merge kernel's lane group loads before combining them: a super node's items are
// otherwise a chain of dependent loads (the hub of powerlaw-1M-16M has ~15K items, ~500 per
// group), which made its merge ~0.5 ms. The items are still combined in the same order.
constexpr int kMergeBatch = 4;
// Every merge kernel's block (one per heavy row and head): powerlaw-1M-16M has 5,262 heavy rows
// of 19 items on average, so a merge launch is ~21K short blocks whose time is their latency
// (the item table, the partials, then group 0's walk over the groups) times the waves; 128
// threads rather than 256 double the resident blocks at the same registers and halve the walk.
// A row's items are capped (plan.py's ATTENTION_MAX_ITEMS) so that 128 / L groups suffice.
constexpr int kMergeThreads = 128;
constexpr float kSoftmaxEps = 1e-16f;
// Blocks of the per-row kernels (forward, pass A, pass B): half of kThreads. A block retires
// when its longest row does, and the warps of its shorter rows idle until then (GAT's forward
// at 256 threads: 40% achieved occupancy of a 50% theoretical, ncu, NOTES v16); 128-thread
// blocks waste half as many warps that way, at the same registers per thread.
constexpr int kRowThreads = 128;
// __launch_bounds__' blocks per SM of kRowThreads for a register bound given in blocks of kThreads.
constexpr int row_blocks(int blocks_of_k_threads) { return blocks_of_k_threads * kThreads / kRowThreads; }

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

// The online-softmax step's arithmetic, each rounding pinned: __fmul_rn and __fadd_rn are never
// contracted into an FMA, fma_pinned (convert.cuh; also the scores' dot products) always is one. Kernels that claim each other's bits
// (shared_rows_forward_kernel against forward_kernel on the rows copied per head) must not
// depend on where nvcc / ptxas contract, which is their choice per instantiation. It was not
// the same: in forward_kernel<kDot, __half, .., L 32, CPL 8> alone, ptxas fused the score's
// `e * scale` into the next `e - m` (one FFMA, fma(e, scale, -m)): the slot's weight then came
// from the unrounded product, 1 float16 ulp off in ~1e-4 of the outputs against the float32
// build and the shared-row kernel (H200, 2026-12-05; SASS; bench/NOTES.md v20). scaled_score
// rounds the product first, so `e - m` is a plain subtraction in every build.
__device__ inline float scaled_score(float e, float scale) { return __fmul_rn(e, scale); }
__device__ inline float rescale(float v, float r) { return __fmul_rn(v, r); }
__device__ inline float add_weight(float s, float w) { return __fadd_rn(s, w); }
__device__ inline float add_weighted(float acc, float w, float v) { return fma_pinned(w, v, acc); }
__device__ inline float drop(float w, float factor) { return __fmul_rn(w, factor); }

template <typename acc_t>
__device__ inline acc_t leaky(acc_t v, acc_t slope) { return v > acc_t(0) ? v : v * slope; }

// Elements of one vector access of a lane's CPL channels: all of them up to 16 bytes (16-bit
// rows at CPL 4 load 8 bytes a lane), else 16-byte pieces.
template <typename scalar_t, int CPL>
constexpr int kChunkOf = CPL * sizeof(scalar_t) <= 16 ? CPL : 16 / sizeof(scalar_t);

// A lane's CPL channels of a row as stored, in 32-bit words. A kernel that gathers several
// slots' rows loads them raw (load_raw) and converts them (to_floats) only once every load of
// the step is issued. A 16-bit conversion right after its load (load_channels' branches), or
// an unpack of the loaded vector into one register per element, is the load's first consumer
// and made each load of a step wait for the one before (SASS; ncu: the bf16 dot forward had
// twice float32's long-scoreboard stall per instruction at half the DRAM bytes, 7.4 against
// 4.8 ms; NOTES v17). Words keep the loaded registers as they are until the conversion.
template <typename scalar_t, int CPL>
struct Raw {
  static_assert(sizeof(scalar_t) == 4 || sizeof(scalar_t) == 2, "float32 or a 16-bit type");
  static constexpr int kPerWord = 4 / sizeof(scalar_t);
  uint32_t w[CPL / kPerWord];
};

__device__ inline uint32_t bits_of(float v) { return __float_as_uint(v); }
__device__ inline uint32_t bits_of(__half v) { return __half_as_ushort(v); }
__device__ inline uint32_t bits_of(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }

// Element t of a raw row as a float: to_acc of the stored value (both conversions are exact).
template <typename scalar_t, int CPL>
__device__ inline float raw_at(const Raw<scalar_t, CPL>& raw, int t) {
  if constexpr (sizeof(scalar_t) == 4) {
    return __uint_as_float(raw.w[t]);
  } else {
    const uint32_t word = raw.w[t / 2];
    if constexpr (std::is_same_v<scalar_t, __nv_bfloat16>) {
      return __uint_as_float(t % 2 == 0 ? word << 16 : word & 0xFFFF0000u);
    } else {
      return __half2float(__ushort_as_half(static_cast<unsigned short>(t % 2 == 0 ? word : word >> 16)));
    }
  }
}

// Channels c0 .. c0 + CPL - 1 of a row as stored, zeros at or beyond C. With `vec` (rows_aligned)
// as whole vector loads of 8 or 16 bytes.
template <typename scalar_t, int CPL>
__device__ inline void load_raw(const scalar_t* row, int64_t c0, int64_t C, bool vec,
                                Raw<scalar_t, CPL>& out) {
  constexpr int kWords = CPL / Raw<scalar_t, CPL>::kPerWord;
  constexpr int kChunkWords = kChunkOf<scalar_t, CPL> * sizeof(scalar_t) / 4;  // 2 or 4
  if (vec) {
    if (c0 >= C) {
#pragma unroll
      for (int q = 0; q < kWords; ++q) out.w[q] = 0u;
      return;
    }
    const auto* words = reinterpret_cast<const uint32_t*>(row + c0);
#pragma unroll
    for (int q = 0; q < kWords; q += kChunkWords) {
      if constexpr (kChunkWords == 4) {
        const uint4 x = *reinterpret_cast<const uint4*>(words + q);
        out.w[q] = x.x, out.w[q + 1] = x.y, out.w[q + 2] = x.z, out.w[q + 3] = x.w;
      } else {
        const uint2 x = *reinterpret_cast<const uint2*>(words + q);
        out.w[q] = x.x, out.w[q + 1] = x.y;
      }
    }
    return;
  }
#pragma unroll
  for (int q = 0; q < kWords; ++q) out.w[q] = 0u;
#pragma unroll
  for (int t = 0; t < CPL; ++t) {
    constexpr int kBits = 8 * sizeof(scalar_t);
    const uint32_t b = c0 + t < C ? bits_of(row[c0 + t]) : 0u;
    out.w[t / Raw<scalar_t, CPL>::kPerWord] |= b << (kBits * (t % Raw<scalar_t, CPL>::kPerWord) % 32);
  }
}

template <typename scalar_t, int CPL>
__device__ inline void to_floats(const Raw<scalar_t, CPL>& raw, float (&out)[CPL]) {
#pragma unroll
  for (int t = 0; t < CPL; ++t) out[t] = raw_at(raw, t);
}

// Channels c0 .. c0 + CPL - 1 of a row as floats, zeros at or beyond C, converted at once: for
// loads that are not batched with others (16-bit: load_raw and to_floats). float32 loads its
// floats directly (the words' bit casts changed ptxas' allocation: 8-16 more bytes of stack in
// several float32 kernels).
template <typename scalar_t, int CPL>
__device__ inline void load_channels(const scalar_t* row, int64_t c0, int64_t C, bool vec,
                                     float (&out)[CPL]) {
  if constexpr (sizeof(scalar_t) == 2) {
    Raw<scalar_t, CPL> raw;
    load_raw<scalar_t, CPL>(row, c0, C, vec, raw);
    to_floats(raw, out);
  } else {
    constexpr int kChunk = kChunkOf<scalar_t, CPL>;
    if (vec) {
      if (c0 >= C) {
#pragma unroll
        for (int t = 0; t < CPL; ++t) out[t] = 0.0f;
        return;
      }
#pragma unroll
      for (int q = 0; q < CPL / kChunk; ++q) {
        const auto v = load_vec<kChunk>(row + c0 + q * kChunk);
#pragma unroll
        for (int e = 0; e < kChunk; ++e) out[q * kChunk + e] = to_acc(v.v[e]);
      }
      return;
    }
#pragma unroll
    for (int t = 0; t < CPL; ++t) out[t] = c0 + t < C ? to_acc(row[c0 + t]) : 0.0f;
  }
}

template <typename scalar_t, int CPL>
__device__ inline void store_channels(scalar_t* row, int64_t c0, int64_t C, bool vec,
                                      const float (&v)[CPL]) {
  constexpr int kChunk = kChunkOf<scalar_t, CPL>;
  if (vec) {
    if (c0 >= C) return;
#pragma unroll
    for (int q = 0; q < CPL / kChunk; ++q) {
      Vec<scalar_t, kChunk> out;
#pragma unroll
      for (int e = 0; e < kChunk; ++e) out.v[e] = from_acc<scalar_t>(v[q * kChunk + e]);
      store_vec<kChunk>(row + c0 + q * kChunk, out);
    }
    return;
  }
#pragma unroll
  for (int t = 0; t < CPL; ++t)
    if (c0 + t < C) row[c0 + t] = from_acc<scalar_t>(v[t]);
}

// out's channels of (row, head h) with the output bias p.bias added: fl(fl(v) + bias), the value
// out already rounded to scalar_t, as PyG's `out + bias` in scalar_t rounds it. No-op without a
// bias. (The bias row is 4-8 KB, read by every task: it stays in L1/L2.)
template <typename scalar_t, int CPL>
__device__ inline void add_output_bias(const AttentionParams& p, int64_t h, int sub,
                                       float (&v)[CPL]) {
  if (!p.bias) return;
  const auto* bias = static_cast<const scalar_t*>(p.bias) + h * p.channels;
#pragma unroll
  for (int t = 0; t < CPL; ++t) {
    const int64_t c = int64_t(sub) * CPL + t;
    if (c < p.channels) v[t] = to_acc(from_acc<scalar_t>(v[t])) + to_acc(bias[c]);
  }
}

// a . row over a group's channels, as head_scores' piece kernel sums it (sum += v * att per
// channel, then the butterfly) and rounded to scalar_t: for GAT's scores from rows.
template <typename scalar_t, int L, int CPL>
__device__ inline float row_score(const Group<L>& g, const float (&row)[CPL], const float (&a)[CPL]) {
  float part = 0.0f;
#pragma unroll
  for (int t = 0; t < CPL; ++t) part = fma_pinned(row[t], a[t], part);
  return to_acc(from_acc<scalar_t>(g.sum(part)));
}

// Per-task constants: the destination-side operands of row i, head h, kept in registers.
template <typename scalar_t, int CPL>
struct DstSide {
  float q[CPL] = {};    // query (GATv2 / dot), 0 beyond C
  float att[CPL] = {};  // att (GATv2), a_src (GAT's scores from rows)
  float score;     // dst_score (GAT)

  __device__ void load(const AttentionParams& p, int64_t i, int64_t h, int sub, bool vec) {
    const int64_t C = p.channels, c0 = int64_t(sub) * CPL;
    if (p.query)
      load_channels<scalar_t, CPL>(static_cast<const scalar_t*>(p.query) + (i * p.heads + h) * C,
                                   c0, C, vec, q);
    if (p.att)
      load_channels<scalar_t, CPL>(static_cast<const scalar_t*>(p.att) + h * C, c0, C, vec, att);
    const auto* ds = static_cast<const scalar_t*>(p.dst_score);
    score = ds ? to_acc(ds[i * p.heads + h]) : 0.0f;
  }

  // GAT's scores from rows (AttentionParams::score_att): att holds a_src's channels, and score
  // is a_dst . value_i, summed as head_scores' piece kernel sums it (each lane's products in
  // channel order, then the butterfly over the group) and rounded to scalar_t as its caller's
  // score tensor is: the bits head_scores gives the backward.
  template <int L>
  __device__ void load_gat_rows(const AttentionParams& p, const Group<L>& g, int64_t i, int64_t h,
                                bool vec) {
    const int64_t H = p.heads, C = p.channels, c0 = int64_t(g.sub) * CPL;
    const auto* a = static_cast<const scalar_t*>(p.score_att);
    load_channels<scalar_t, CPL>(a + h * C, c0, C, vec, att);
    float a_dst[CPL], row[CPL];
    load_channels<scalar_t, CPL>(a + (H + h) * C, c0, C, vec, a_dst);
    load_channels<scalar_t, CPL>(static_cast<const scalar_t*>(p.value) + (i * H + h) * C, c0, C,
                                 vec, row);
    score = row_score<scalar_t>(g, row, a_dst);
  }
};

// The source-side inputs of slot k's score, loaded apart from the arithmetic so that a kernel
// can issue the loads of several slots before the first reduction: GAT's two scalars (kk[0]),
// or key_j + edge_key_k per channel. kKeyIsValue with GAT: its scores from rows (score_att),
// whose key is value_j's channels. In two steps: issue_key loads what is gathered by j (raw),
// finish_key converts it and adds the edge's own term (slot k: rare, loaded there).
template <ScoreKind K, typename scalar_t, int L, int CPL, bool kKeyIsValue = false>
__device__ inline void issue_key(const AttentionParams& p, const Group<L>& g, int64_t j, int64_t h,
                                 Raw<scalar_t, CPL>& raw) {
  const int64_t H = p.heads, C = p.channels;
  if constexpr (K == ScoreKind::kGat && !kKeyIsValue) {
    raw.w[0] = bits_of(load_evict_last(static_cast<const scalar_t*>(p.src_score) + j * H + h));
  } else {
    const void* rows = K == ScoreKind::kGat ? p.value : p.key;
    load_raw<scalar_t, CPL>(static_cast<const scalar_t*>(rows) + (j * H + h) * C, int64_t(g.sub) * CPL,
                            C, p.vector_io, raw);
  }
}

template <ScoreKind K, typename scalar_t, int L, int CPL, bool kKeyIsValue = false>
__device__ inline void finish_key(const AttentionParams& p, const Group<L>& g, int64_t k, int64_t h,
                                  const Raw<scalar_t, CPL>& raw, float (&kk)[CPL]) {
  const int64_t H = p.heads, C = p.channels;
  if constexpr (K == ScoreKind::kGat && kKeyIsValue) {
    to_floats(raw, kk);
  } else if constexpr (K == ScoreKind::kGat) {
    const auto* es = static_cast<const scalar_t*>(p.edge_score);
    kk[0] = raw_at(raw, 0) + (es ? to_acc(es[k * H + h]) : 0.0f);
  } else {
    to_floats(raw, kk);
    if (p.edge_key) {
      float ek[CPL];
      load_channels<scalar_t, CPL>(static_cast<const scalar_t*>(p.edge_key) + (k * H + h) * C,
                                   int64_t(g.sub) * CPL, C, p.vector_io, ek);
#pragma unroll
      for (int t = 0; t < CPL; ++t) kk[t] += ek[t];
    }
  }
}

// What issue_key then finish_key give, in one step, for loads not batched with others and for
// float32's slots (its own code: the float32 kernels compile from it as before the split, whose
// words changed ptxas' allocation there; test_attention_cuda checks both against float64).
template <ScoreKind K, typename scalar_t, int L, int CPL, bool kKeyIsValue = false>
__device__ inline void load_key(const AttentionParams& p, const Group<L>& g, int64_t j, int64_t k,
                                int64_t h, float (&kk)[CPL]) {
  const int64_t H = p.heads, C = p.channels;
  if constexpr (K == ScoreKind::kGat && kKeyIsValue) {
    load_channels<scalar_t, CPL>(static_cast<const scalar_t*>(p.value) + (j * H + h) * C,
                                 int64_t(g.sub) * CPL, C, p.vector_io, kk);
    return;
  } else if constexpr (K == ScoreKind::kGat) {
    const auto* ss = static_cast<const scalar_t*>(p.src_score);
    const auto* es = static_cast<const scalar_t*>(p.edge_score);
    kk[0] = to_acc(load_evict_last(ss + j * H + h)) + (es ? to_acc(es[k * H + h]) : 0.0f);
    return;
  }
  const int64_t c0 = int64_t(g.sub) * CPL;
  load_channels<scalar_t, CPL>(static_cast<const scalar_t*>(p.key) + (j * H + h) * C, c0, C, p.vector_io, kk);
  if (p.edge_key) {
    float ek[CPL];
    load_channels<scalar_t, CPL>(static_cast<const scalar_t*>(p.edge_key) + (k * H + h) * C, c0, C,
                                 p.vector_io, ek);
#pragma unroll
    for (int t = 0; t < CPL; ++t) kk[t] += ek[t];
  }
}

// e of a slot from its loaded key. z keeps what the backward differentiates through: the
// pre-activation (GAT: z[0]; GATv2: per channel) or the key + edge key (dot).
template <ScoreKind K, typename scalar_t, int L, int CPL, bool kKeyIsValue = false>
__device__ inline float score_of(const AttentionParams& p, const Group<L>& g,
                                 const DstSide<scalar_t, CPL>& d, const float (&kk)[CPL],
                                 float (&z)[CPL]) {
  const float slope = static_cast<float>(p.negative_slope);
  if constexpr (K == ScoreKind::kGat && kKeyIsValue) {
    z[0] = row_score<scalar_t>(g, kk, d.att) + d.score;
    return leaky(z[0], slope);
  } else if constexpr (K == ScoreKind::kGat) {
    z[0] = kk[0] + d.score;
    return leaky(z[0], slope);
  }
  float part = 0.0f;
#pragma unroll
  for (int t = 0; t < CPL; ++t) {
    if constexpr (K == ScoreKind::kGatV2) {
      z[t] = kk[t] + d.q[t];
      part += d.att[t] * leaky(z[t], slope);
    } else {
      z[t] = kk[t];
      part = fma_pinned(d.q[t], kk[t], part);
    }
  }
  const float e = g.sum(part);
  return K == ScoreKind::kDot ? scaled_score(e, static_cast<float>(p.scale)) : e;
}

// e of slot k (edge j -> i, head h), loads and arithmetic together.
template <ScoreKind K, typename scalar_t, int L, int CPL>
__device__ inline float edge_score(const AttentionParams& p, const Group<L>& g,
                                   const DstSide<scalar_t, CPL>& d, int64_t j, int64_t k,
                                   int64_t h, float (&z)[CPL]) {
  float kk[CPL];
  load_key<K, scalar_t, L, CPL>(p, g, j, k, h, kk);
  return score_of<K, scalar_t, L, CPL>(p, g, d, kk, z);
}

// value_j + edge_value_k for this lane's channels, in load_key's two steps.
template <typename scalar_t, int L, int CPL>
__device__ inline void issue_value(const AttentionParams& p, const Group<L>& g, int64_t j, int64_t h,
                                   Raw<scalar_t, CPL>& raw) {
  const int64_t C = p.channels;
  load_raw<scalar_t, CPL>(static_cast<const scalar_t*>(p.value) + (j * p.heads + h) * C,
                          int64_t(g.sub) * CPL, C, p.vector_io, raw);
}

template <typename scalar_t, int L, int CPL>
__device__ inline void finish_value(const AttentionParams& p, const Group<L>& g, int64_t k, int64_t h,
                                    const Raw<scalar_t, CPL>& raw, float (&v)[CPL]) {
  to_floats(raw, v);
  if (p.edge_value) {
    const int64_t C = p.channels;
    float ev[CPL];
    load_channels<scalar_t, CPL>(static_cast<const scalar_t*>(p.edge_value) + (k * p.heads + h) * C,
                                 int64_t(g.sub) * CPL, C, p.vector_io, ev);
#pragma unroll
    for (int t = 0; t < CPL; ++t) v[t] += ev[t];
  }
}

// What issue_value then finish_value give, in one step (as load_key).
template <typename scalar_t, int L, int CPL>
__device__ inline void load_value(const AttentionParams& p, const Group<L>& g, int64_t j,
                                  int64_t k, int64_t h, float (&v)[CPL]) {
  const int64_t H = p.heads, C = p.channels, c0 = int64_t(g.sub) * CPL;
  load_channels<scalar_t, CPL>(static_cast<const scalar_t*>(p.value) + (j * H + h) * C, c0, C, p.vector_io, v);
  if (p.edge_value) {
    float ev[CPL];
    load_channels<scalar_t, CPL>(static_cast<const scalar_t*>(p.edge_value) + (k * H + h) * C, c0, C,
                                 p.vector_io, ev);
#pragma unroll
    for (int t = 0; t < CPL; ++t) v[t] += ev[t];
  }
}

// The key and value rows of a step's U slots (j[u], slot base + u for u < n, else the step's
// first slot again). 16-bit rows: every gather issued before the first conversion (Raw). float32
// rows need no conversion and keep load_key / load_value per slot: ptxas spilled more with the
// split order (8-16 more bytes of stack in the dot and GATv2 kernels).
template <ScoreKind K, typename scalar_t, int L, int CPL, bool kKeyIsValue, int U>
__device__ inline void load_slots(const AttentionParams& p, const Group<L>& g, const int64_t (&j)[U],
                                  int64_t base, int n, int64_t h, float (&kk)[U][CPL],
                                  float (&v)[U][CPL]) {
  if constexpr (sizeof(scalar_t) >= 4) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = base + (u < n ? u : 0);
      load_key<K, scalar_t, L, CPL, kKeyIsValue>(p, g, j[u], k, h, kk[u]);
      if constexpr (!kKeyIsValue) {
        load_value<scalar_t, L, CPL>(p, g, j[u], k, h, v[u]);
      } else {
#pragma unroll
        for (int t = 0; t < CPL; ++t) v[u][t] = kk[u][t];
      }
    }
  } else {
    Raw<scalar_t, CPL> rk[U], rv[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      issue_key<K, scalar_t, L, CPL, kKeyIsValue>(p, g, j[u], h, rk[u]);
      if constexpr (!kKeyIsValue) issue_value<scalar_t, L, CPL>(p, g, j[u], h, rv[u]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t k = base + (u < n ? u : 0);
      finish_key<K, scalar_t, L, CPL, kKeyIsValue>(p, g, k, h, rk[u], kk[u]);
      if constexpr (!kKeyIsValue) {
        finish_value<scalar_t, L, CPL>(p, g, k, h, rv[u], v[u]);
      } else {  // the key is the value row: one load serves both
#pragma unroll
        for (int t = 0; t < CPL; ++t) v[u][t] = kk[u][t];
      }
    }
  }
}

// The source (or destination) indices of a group's next slots, loaded by the group's lanes
// together: one coalesced load per batch instead of one dependent load per slot, so the
// feature-row loads of a whole batch can be issued back to back. A batch is kSize slots: one
// per lane when a lane group is at least U wide, else U (each lane holding U / L of them).
template <typename index_t, int L, int U>
struct SlotBatch {
  static constexpr int kPerLane = L >= U ? 1 : U / L;
  static constexpr int kSize = L * kPerLane;
  index_t idx[kPerLane];

  // Slots base .. base + kSize - 1 (those at or past end read entry `begin`, a valid slot).
  __device__ void load(const index_t* indices, int64_t base, int64_t begin, int64_t end, int sub) {
#pragma unroll
    for (int t = 0; t < kPerLane; ++t) {
      const int64_t k = base + t * L + sub;
      idx[t] = indices[k < end ? k : begin];
    }
  }
  // Index of slot u0 + u of the batch; u is a compile-time constant (unrolled), and u0 is 0
  // whenever kPerLane > 1 (the batch is then one step of U slots).
  __device__ int64_t get(const Group<L>& g, int u0, int u) const {
    if constexpr (kPerLane == 1) {
      return static_cast<int64_t>(__shfl_sync(g.mask, idx[0], u0 + u, L));
    } else {
      return static_cast<int64_t>(__shfl_sync(g.mask, idx[u / L], u % L, L));
    }
  }
};

// Slots whose loads a group issues together: enough vector loads in flight per lane to cover
// the gather's latency, without so many registers that occupancy halves. GAT's score is a
// scalar per slot, so at CPL 8 (heads above 128 channels) it affords twice the slots of the
// kinds that load a key row too; at CPL 4 its 8 slots' values alone are 32 registers, and
// at the 80-register bound of 3 blocks per SM its forward spilled 52 / 68 bytes and pass A
// 76 / 100 (ptxas), so it takes 4 like the others (no spills).
template <ScoreKind K, int CPL>
constexpr int kSlotsInFlight = (K == ScoreKind::kGat && CPL >= 8 ? 32 : 16) / CPL >= 2
                                   ? (K == ScoreKind::kGat && CPL >= 8 ? 32 : 16) / CPL : 2;

// Dropout factor of slot k, head h: 1/(1-p) if kept, else 0 (1 without dropout).
__device__ inline float dropout_factor(const AttentionParams& p, int64_t k, int64_t h) {
  if (p.dropout_threshold == 0) return 1.0f;
  return dropout_keep_fast(p.seed_mix, p.dropout_threshold, k, h, p.heads) ? p.dropout_scale : 0.0f;
}

// Calls fn(std::integral_constant<ScoreKind, K>) for the kind of p: each kind is its own kernel,
// so GAT's scalar scores do not carry GATv2's per-channel registers.
template <typename Fn>
void dispatch_kind(ScoreKind kind, Fn&& fn) {
  switch (kind) {
    case ScoreKind::kGat: return fn(std::integral_constant<ScoreKind, ScoreKind::kGat>{});
    case ScoreKind::kGatV2: return fn(std::integral_constant<ScoreKind, ScoreKind::kGatV2>{});
    case ScoreKind::kDot: return fn(std::integral_constant<ScoreKind, ScoreKind::kDot>{});
  }
}

// Whether GATv2's value rows are its key rows with no edge term on either: one row load per slot.
inline bool key_is_value(const AttentionParams& p) {
  return p.kind == ScoreKind::kGatV2 && p.key == p.value && !p.edge_key && !p.edge_value;
}

// Whether GAT's scores come from the value rows (score_att: the CUDA forward only).
inline bool gat_scores_from_rows(const AttentionParams& p) {
  return p.kind == ScoreKind::kGat && p.score_att != nullptr;
}

// dispatch_kind, and fn's second argument std::true_type when key_is_value(p) (or, with
// kGatRows, gat_scores_from_rows(p): the forward's, whose key is value_j too). A kernel whose
// key and value rows may differ holds both for its slots in flight even when they are the same
// (GATv2's forward, pass A and pass B spilled 68-120 bytes a thread at 4 x 32 channels); the
// constant lets it hold one.
template <bool kGatRows = false, typename Fn>
void dispatch_kind_kv(const AttentionParams& p, Fn&& fn) {
  dispatch_kind(p.kind, [&](auto kind) {
    if constexpr (decltype(kind)::value == ScoreKind::kGatV2) {
      if (key_is_value(p)) return fn(kind, std::true_type{});
    }
    if constexpr (kGatRows && decltype(kind)::value == ScoreKind::kGat) {
      if (gat_scores_from_rows(p)) return fn(kind, std::true_type{});
    }
    fn(kind, std::false_type{});
  });
}

inline int blocks_for(int64_t threads, int64_t block = kThreads) {
  const int64_t b = (threads + block - 1) / block;
  return static_cast<int>(b < 1 ? 1 : (b > (1 << 30) ? (1 << 30) : b));
}


// Calls fn(std::integral_constant<int, L>, std::integral_constant<int, CPL>): CPL channels per
// lane (4: 16 bytes of float32, 8 of a 16-bit type; 8 when a head exceeds 128 channels), L the
// smallest power of two of lanes that covers a head (at most 32, so C <= 256). 16-bit rows take
// the float32 layout rather than 16-byte pieces (CPL 8): at 4 x 32 a warp then holds one row,
// not two whose degrees differ, and the kernels keep float32's registers and occupancy (CPL 8
// needed 2 blocks of 256 per SM, and its forward, pass A and pass B ran 1.3-1.6x float32's time
// on powerlaw-1M-16M with half the bytes; NOTES v17). head_scores_piece is the same choice.
template <typename scalar_t, typename Fn>
void dispatch_layout(int64_t channels, Fn&& fn) {
  constexpr int kCpl = 4;
  auto with = [&](auto cpl) {
    constexpr int CPL = decltype(cpl)::value;
    const int64_t lanes = (channels + CPL - 1) / CPL;
    if (lanes <= 1) return fn(std::integral_constant<int, 1>{}, cpl);
    if (lanes <= 2) return fn(std::integral_constant<int, 2>{}, cpl);
    if (lanes <= 4) return fn(std::integral_constant<int, 4>{}, cpl);
    if (lanes <= 8) return fn(std::integral_constant<int, 8>{}, cpl);
    if (lanes <= 16) return fn(std::integral_constant<int, 16>{}, cpl);
    return fn(std::integral_constant<int, 32>{}, cpl);
  };
  if (channels <= 32 * kCpl) return with(std::integral_constant<int, kCpl>{});
  // 129..256 channels: 17..32 lanes of 8, so only L = 32 (not with(8), which would instantiate
  // five layouts that no call reaches).
  return fn(std::integral_constant<int, 32>{}, std::integral_constant<int, 8>{});
}

// The launchers' dispatch: fn(scalar_t{}, index_t{}, L, CPL) for p's element type, index type
// and channel layout (dispatch_layout). float64 instantiates nothing: the launchers refuse it.
template <typename Fn>
void dispatch_attention(const AttentionParams& p, Fn&& fn) {
  dispatch_cuda(p.scalar_type, p.index_type, [&](auto scalar, auto index) {
    if constexpr (!std::is_same_v<decltype(scalar), double>)
      dispatch_layout<decltype(scalar)>(p.channels, [&](auto l, auto cpl) { fn(scalar, index, l, cpl); });
  });
}

constexpr int64_t kMaxCudaChannels = 256;

// The launcher-set dropout fields of AttentionParams (see params.h).
inline void set_dropout_test(AttentionParams& p) {
  const DropoutTest t = dropout_test(p.seed, p.dropout);
  p.seed_mix = t.seed_mix;
  p.dropout_threshold = p.dropout > 0.0 ? t.threshold : 0;
  p.dropout_scale = p.dropout > 0.0 ? static_cast<float>(1.0 / (1.0 - p.dropout)) : 1.0f;
}

// Whether every base pointer the kernels read rows from is 16-byte aligned and C a multiple of
// the lane's CPL channels, so that every lane's channels start on a boundary of min(their size,
// 16 bytes) (8 bytes for 16-bit rows at CPL 4): then AttentionParams::vector_io may be set.
inline bool rows_aligned(const AttentionParams& p, int cpl, std::initializer_list<const void*> more) {
  if (p.channels % cpl != 0) return false;
  for (const void* ptr : {p.value, p.key, p.query, p.edge_key, p.edge_value, p.att, p.score_att,
                          static_cast<const void*>(p.out), static_cast<const void*>(p.out_acc)})
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return false;
  for (const void* ptr : more)
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0) return false;
  return true;
}

}  // namespace gnnio::attention_detail
