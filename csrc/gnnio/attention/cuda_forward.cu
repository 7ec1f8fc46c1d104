// Forward kernels of the attention family (see params.h for the math).
//
// One group of lanes per (task, head), where a task is a light destination row or one work item
// (a chunk of slots) of a heavy row. The group streams over the slots once: score, online
// softmax update (running max m, sum s, accumulator acc), weighted value. A light row writes
// out and stats; a work item writes its partial (m, s, acc), and the merge kernel combines the
// items of each heavy row in item order: M = max m_t, S = sum s_t e^(m_t - M),
// ACC = sum acc_t e^(m_t - M), which is exact up to rounding and independent of scheduling.
#include <cstdlib>
#include <type_traits>

#include "gnnio/attention/head_scores.h"
#include "gnnio/attention/score.cuh"
#include "gnnio/common/cuda_check.h"

namespace gnnio {
namespace {

using namespace attention_detail;

struct Partial {  // workspace layout of the work items' partial states
  float* m;       // [num_items, H]
  float* s;       // [num_items, H]
  float* acc;     // [num_items, H, C]
};

// Blocks of kThreads (256) per SM that the forward's registers are bounded for. The kernel is
// latency-bound (ncu, NOTES v14: long-scoreboard stalls first, DRAM at 41-49% of peak), so more
// resident warps mean more rows in flight. At CPL 4 GAT and GATv2 whose key is its value fit
// 64 registers (4 blocks) and spill only outside the slot loop (16-40 bytes: the task's bounds,
// ptxas and SASS); the kinds that hold a key and a value row per slot would spill 120-220 bytes
// at 64 and keep 80 (3 blocks). CPL 8 (heads above 128 channels) keeps 2 blocks (<= 122).
template <ScoreKind K, int CPL, bool kKeyIsValue>
constexpr int kForwardMinBlocks = CPL >= 8 ? 2 : (K == ScoreKind::kGat || kKeyIsValue ? 4 : 3);

// kKeyIsValue: key_is_value(p), or for GAT gat_scores_from_rows(p) (dispatch_kind_kv<true>).
template <ScoreKind K, typename scalar_t, typename index_t, int L, int CPL, bool kKeyIsValue>
__global__ void __launch_bounds__(kRowThreads, row_blocks(kForwardMinBlocks<K, CPL, kKeyIsValue>))
    forward_kernel(AttentionParams p, Partial part) {
  const Group<L> g;
  const int64_t group = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / L;
  const int64_t task = group / p.heads, h = group % p.heads;
  if (task >= p.num_dst + p.split.num_items) return;
  const auto* rowptr = static_cast<const index_t*>(p.rowptr);
  const auto* col = static_cast<const index_t*>(p.col);
  int64_t i, begin, end;
  // Work items first: they are the longest tasks, so they start in the first waves.
  const bool item = task < p.split.num_items;
  if (!item) {
    i = task - p.split.num_items;
    begin = rowptr[i];
    end = rowptr[i + 1];
    if (end - begin > p.split.light_max_degree) return;  // heavy: its work items cover it
  } else {
    const int64_t* it = p.split.heavy_items + task * 3;
    i = p.split.heavy_rows[it[0]];
    begin = it[1];
    end = it[2];
  }
  DstSide<scalar_t, CPL> d;
  if constexpr (K == ScoreKind::kGat && kKeyIsValue) {
    d.load_gat_rows(p, g, i, h, p.vector_io);
  } else {
    d.load(p, i, h, g.sub, p.vector_io);
  }
  float m = -INFINITY, s = 0.0f, acc[CPL];
#pragma unroll
  for (int t = 0; t < CPL; ++t) acc[t] = 0.0f;
  auto* weights = static_cast<float*>(p.weights);
  constexpr int U = kSlotsInFlight<K, CPL>;
  using Batch = SlotBatch<index_t, L, U>;
  // One step: slots u0 .. u0 + n - 1 of the batch, their loads issued before any arithmetic
  // (a row's slots are otherwise one dependent load chain and the gather latency-bound).
  auto step = [&](const Batch& batch, int64_t base, int u0, int n) {
    int64_t j[U];
    float kk[U][CPL], v[U][CPL], e[U];
#pragma unroll
    for (int u = 0; u < U; ++u) j[u] = batch.get(g, u0, u);
    load_slots<K, scalar_t, L, CPL, kKeyIsValue, U>(p, g, j, base + u0, n, h, kk, v);
    float m_new = m;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float z[CPL];
      e[u] = score_of<K, scalar_t, L, CPL, kKeyIsValue>(p, g, d, kk[u], z);
      if (u < n) {
        m_new = fmaxf(m_new, e[u]);
        if (weights && g.sub == 0) weights[(base + u0 + u) * p.heads + h] = e[u];  // normalised later
      }
    }
    // A new running max rescales what was summed so far (exp(-inf) = 0 on the first step).
    const float r = expf(m - m_new);
    m = m_new;
    s = rescale(s, r);
#pragma unroll
    for (int t = 0; t < CPL; ++t) acc[t] = rescale(acc[t], r);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u >= n) continue;
      const float w = expf(e[u] - m);
      s = add_weight(s, w);
      const float wr = drop(w, dropout_factor(p, base + u0 + u, h));
#pragma unroll
      for (int t = 0; t < CPL; ++t) acc[t] = add_weighted(acc[t], wr, v[u][t]);
    }
  };
  for (int64_t base = begin; base < end; base += Batch::kSize) {
    Batch batch;
    batch.load(col, base, begin, end, g.sub);
    const int count = end - base < Batch::kSize ? static_cast<int>(end - base) : Batch::kSize;
    if constexpr (Batch::kPerLane > 1) {
      step(batch, base, 0, count);
    } else {
#pragma unroll 1
      for (int u0 = 0; u0 < count; u0 += U) step(batch, base, u0, count - u0 < U ? count - u0 : U);
    }
  }
  const int64_t H = p.heads, C = p.channels;
  if (item) {
    const int64_t slot = task * H + h;
    if (g.sub == 0) part.m[slot] = m, part.s[slot] = s;
#pragma unroll
    for (int t = 0; t < CPL; ++t) {
      const int64_t c = int64_t(g.sub) * CPL + t;
      if (c < C) part.acc[slot * C + c] = acc[t];
    }
    return;
  }
  const float denom = s + kSoftmaxEps;
#pragma unroll
  for (int t = 0; t < CPL; ++t) acc[t] /= denom;
  if (p.out_acc)  // the attention output alone: the bias is never in out_acc
    store_channels<float, CPL>(static_cast<float*>(p.out_acc) + (i * H + h) * C, int64_t(g.sub) * CPL,
                               C, p.vector_io, acc);
  add_output_bias<scalar_t, CPL>(p, h, g.sub, acc);
  store_channels<scalar_t, CPL>(static_cast<scalar_t*>(p.out) + (i * H + h) * C, int64_t(g.sub) * CPL,
                                C, p.vector_io, acc);
  if (g.sub == 0) {
    auto* st = static_cast<float*>(p.stats) + (i * H + h) * 2;
    st[0] = begin == end ? 0.0f : m;
    st[1] = denom;
  }
}

// One block per (heavy row, head). Its lane groups merge interleaved subsets of the row's work
// items (group q takes items q, q + G, ...), then group 0 merges the groups' results in group
// order: a fixed tree, so the result does not depend on scheduling, and a 2M-slot row's thousands
// of items are merged in parallel rather than by one walk. The row's items are read from
// p.split.item_offsets (fill_item_offsets). Blocks of kMergeThreads (score.cuh); __launch_bounds__
// asks for 8 blocks per SM, 64 registers, for the CPL-4 layouts (ptxas gave them 78 with 128
// threads alone), and 5 for CPL 8 (79 registers, no spills; 6 spilled at L = 1).

template <typename scalar_t, int L, int CPL>
__global__ void __launch_bounds__(kMergeThreads, CPL >= 8 ? 5 : 8) merge_kernel(AttentionParams p, Partial part) {
  extern __shared__ float shared[];  // [G] m, [G] s, [G][C] acc
  constexpr int G = kMergeThreads / L;
  const Group<L> g;
  const int q = threadIdx.x / L;
  const int64_t hi = blockIdx.x / p.heads, h = blockIdx.x % p.heads;
  const int64_t H = p.heads, C = p.channels;
  const int64_t first = p.split.item_offsets[hi], last = p.split.item_offsets[hi + 1];
  float M = -INFINITY, S = 0.0f, acc[CPL] = {};
  for (int64_t it0 = first + q; it0 < last; it0 += kMergeBatch * G) {
    float mb[kMergeBatch], sb[kMergeBatch], ab[kMergeBatch][CPL];
#pragma unroll
    for (int u = 0; u < kMergeBatch; ++u) {  // loads first (past the end: the first item again)
      const int64_t it = it0 + int64_t(u) * G, slot = (it < last ? it : first) * H + h;
      mb[u] = part.m[slot];
      sb[u] = part.s[slot];
#pragma unroll
      for (int t = 0; t < CPL; ++t) {
        const int64_t c = int64_t(g.sub) * CPL + t;
        ab[u][t] = c < C ? part.acc[slot * C + c] : 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < kMergeBatch; ++u) {
      if (it0 + int64_t(u) * G >= last) break;
      const float m = mb[u], M_new = fmaxf(M, m);
      const float r_old = expf(M - M_new), r = expf(m - M_new);
      // (Pinned roundings, score.cuh: every dtype's build merges with the same bits.)
      S = add_weight(rescale(S, r_old), rescale(sb[u], r));
#pragma unroll
      for (int t = 0; t < CPL; ++t) {
        const int64_t c = int64_t(g.sub) * CPL + t;
        acc[t] = add_weight(rescale(acc[t], r_old), c < C ? rescale(ab[u][t], r) : 0.0f);
      }
      M = M_new;
    }
  }
  float* sm_m = shared;
  float* sm_s = shared + G;
  float* sm_acc = shared + 2 * G;
  if (g.sub == 0) sm_m[q] = M, sm_s[q] = S;
#pragma unroll
  for (int t = 0; t < CPL; ++t) {
    const int64_t c = int64_t(g.sub) * CPL + t;
    if (c < C) sm_acc[q * C + c] = acc[t];
  }
  __syncthreads();
  if (q != 0) return;
  // Groups past the row's item count have nothing: a row of 5 items leaves 11 of the 16 empty.
  const int used = last - first < G ? static_cast<int>(last - first) : G;
  M = -INFINITY;
  for (int w = 0; w < used; ++w) M = fmaxf(M, sm_m[w]);
  S = 0.0f;
#pragma unroll
  for (int t = 0; t < CPL; ++t) acc[t] = 0.0f;
  for (int w = 0; w < used; ++w) {
    if (sm_m[w] == -INFINITY) continue;  // a group without items
    const float r = expf(sm_m[w] - M);
    S = add_weighted(S, sm_s[w], r);
#pragma unroll
    for (int t = 0; t < CPL; ++t) {
      const int64_t c = int64_t(g.sub) * CPL + t;
      if (c < C) acc[t] = add_weighted(acc[t], sm_acc[w * C + c], r);
    }
  }
  const int64_t i = p.split.heavy_rows[hi];
  auto* out = static_cast<scalar_t*>(p.out) + (i * H + h) * C;
  const float denom = S + kSoftmaxEps;
#pragma unroll
  for (int t = 0; t < CPL; ++t) {
    const int64_t c = int64_t(g.sub) * CPL + t;
    acc[t] /= denom;
    if (c < C && p.out_acc) static_cast<float*>(p.out_acc)[(i * H + h) * C + c] = acc[t];
  }
  add_output_bias<scalar_t, CPL>(p, h, g.sub, acc);
#pragma unroll
  for (int t = 0; t < CPL; ++t) {
    const int64_t c = int64_t(g.sub) * CPL + t;
    if (c < C) out[c] = from_acc<scalar_t>(acc[t]);
  }
  if (g.sub == 0) {
    auto* st = static_cast<float*>(p.stats) + (i * H + h) * 2;
    st[0] = M;
    st[1] = denom;
  }
}

// Shared key and value rows that are one row (params.h's shared_kv with key == value: kind dot,
// no edge terms, no weights; TransformerConv's reassociated form, whose key and value are x): one
// warp per task (a light row, or a heavy row's work item) walks the row once for all heads.
// Lane `sub` holds channels sub * CPL .. of the source's one row (loaded once per slot, for every
// head), and of each head's query and accumulator; each head's score is its own butterfly over
// the warp. The per-head kernel on the rows copied per head gathers each row H times (the
// layout is head-major, so the copies are H separate loads); this one gathers it once: 1/H of
// the row bytes. The sums are that kernel's, in its order (its lane channels, its butterfly
// with zeros from the lanes past C, its steps of U slots from the row's start, the same work
// items and merge), so out and stats are its bits and its backward (on copied rows) is exact.
// HM: heads a warp holds, HM * CPL <= 32 (a query and an accumulator per head: 2 HM CPL
// registers); a task's H heads are ceil(H / HM) warps (head groups), each loading the row (the
// later ones from L1, as a rule: they are neighbours in the block). Fewer heads a warp, fewer
// registers and more resident warps (GNNIO_SHARED_ROWS_HEADS, an A/B knob: 109 registers at
// 4 heads of 4 channels against 80 at 2, ptxas). The sums of a head do not depend on its group.

template <typename scalar_t, typename index_t, int CPL, int HM>
__global__ void __launch_bounds__(kRowThreads) shared_rows_forward_kernel(AttentionParams p, Partial part) {
  const Group<32> g;
  const int64_t warp = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32;
  const int64_t head_groups = (p.heads + HM - 1) / HM;
  const int64_t task = warp / head_groups, h0 = warp % head_groups * HM;
  if (task >= p.num_dst + p.split.num_items) return;
  const auto* rowptr = static_cast<const index_t*>(p.rowptr);
  const auto* col = static_cast<const index_t*>(p.col);
  int64_t i, begin, end;
  const bool item = task < p.split.num_items;  // work items first, as forward_kernel
  if (!item) {
    i = task - p.split.num_items;
    begin = rowptr[i];
    end = rowptr[i + 1];
    if (end - begin > p.split.light_max_degree) return;
  } else {
    const int64_t* it = p.split.heavy_items + task * 3;
    i = p.split.heavy_rows[it[0]];
    begin = it[1];
    end = it[2];
  }
  // This warp's heads: h0 + h for h < nh.
  const int64_t H = p.heads, C = p.channels, c0 = int64_t(g.sub) * CPL;
  const int64_t nh = H - h0 < HM ? H - h0 : HM;
  const auto* rows = static_cast<const scalar_t*>(p.value);
  float q[HM][CPL], acc[HM][CPL], m[HM], s[HM];
#pragma unroll
  for (int h = 0; h < HM; ++h) {
    if (h < nh) {
      load_channels<scalar_t, CPL>(static_cast<const scalar_t*>(p.query) + (i * H + h0 + h) * C, c0, C,
                                   p.vector_io, q[h]);
    } else {
#pragma unroll
      for (int t = 0; t < CPL; ++t) q[h][t] = 0.0f;
    }
    m[h] = -INFINITY;
    s[h] = 0.0f;
#pragma unroll
    for (int t = 0; t < CPL; ++t) acc[h][t] = 0.0f;
  }
  const float scale = static_cast<float>(p.scale);
  constexpr int U = kSlotsInFlight<ScoreKind::kDot, CPL>;
  using Batch = SlotBatch<index_t, 32, U>;
  for (int64_t base = begin; base < end; base += Batch::kSize) {
    Batch batch;
    batch.load(col, base, begin, end, g.sub);
    const int count = end - base < Batch::kSize ? static_cast<int>(end - base) : Batch::kSize;
#pragma unroll 1
    for (int u0 = 0; u0 < count; u0 += U) {
      const int n = count - u0 < U ? count - u0 : U;
      Raw<scalar_t, CPL> raw[U];
#pragma unroll
      for (int u = 0; u < U; ++u) load_raw<scalar_t, CPL>(rows + batch.get(g, u0, u) * C, c0, C, p.vector_io, raw[u]);
      float x[U][CPL];
#pragma unroll
      for (int u = 0; u < U; ++u) to_floats(raw[u], x[u]);
#pragma unroll
      for (int h = 0; h < HM; ++h) {
        if (h >= nh) continue;
        float e[U];
        float m_new = m[h];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          float part = 0.0f;
#pragma unroll
          for (int t = 0; t < CPL; ++t) part = fma_pinned(q[h][t], x[u][t], part);
          e[u] = scaled_score(g.sum(part), scale);
          if (u < n) m_new = fmaxf(m_new, e[u]);
        }
        const float r = expf(m[h] - m_new);
        m[h] = m_new;
        s[h] = rescale(s[h], r);
#pragma unroll
        for (int t = 0; t < CPL; ++t) acc[h][t] = rescale(acc[h][t], r);
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (u >= n) continue;
          const float w = expf(e[u] - m_new);
          s[h] = add_weight(s[h], w);
          const float wr = drop(w, dropout_factor(p, base + u0 + u, h0 + h));
#pragma unroll
          for (int t = 0; t < CPL; ++t) acc[h][t] = add_weighted(acc[h][t], wr, x[u][t]);
        }
      }
    }
  }
#pragma unroll
  for (int h = 0; h < HM; ++h) {
    if (h >= nh) continue;
    if (item) {
      const int64_t slot = task * H + h0 + h;
      if (g.sub == 0) part.m[slot] = m[h], part.s[slot] = s[h];
#pragma unroll
      for (int t = 0; t < CPL; ++t)
        if (c0 + t < C) part.acc[slot * C + c0 + t] = acc[h][t];
      continue;
    }
    const float denom = s[h] + kSoftmaxEps;
#pragma unroll
    for (int t = 0; t < CPL; ++t) acc[h][t] /= denom;
    if (p.out_acc)
      store_channels<float, CPL>(static_cast<float*>(p.out_acc) + (i * H + h0 + h) * C, c0, C, p.vector_io,
                                 acc[h]);
    add_output_bias<scalar_t, CPL>(p, h0 + h, g.sub, acc[h]);
    store_channels<scalar_t, CPL>(static_cast<scalar_t*>(p.out) + (i * H + h0 + h) * C, c0, C, p.vector_io,
                                  acc[h]);
    if (g.sub == 0) {
      auto* st = static_cast<float*>(p.stats) + (i * H + h0 + h) * 2;
      st[0] = begin == end ? 0.0f : m[h];
      st[1] = denom;
    }
  }
}

// shared_rows_forward_kernel's CPL for C channels: forward_kernel's (dispatch_layout) at L = 32.
inline int shared_rows_cpl(int64_t channels) { return channels <= 128 ? 4 : 8; }

// Heads a warp of shared_rows_forward_kernel holds: all of a task's (at most 8, 4 at 8 channels
// a lane), or at most GNNIO_SHARED_ROWS_HEADS (2, 4 or 8) of them.
inline int64_t shared_rows_heads_per_warp(const AttentionParams& p) {
  int64_t cap = shared_rows_cpl(p.channels) == 4 ? 8 : 4;
  if (const char* knob = std::getenv("GNNIO_SHARED_ROWS_HEADS")) {
    const int64_t asked = std::atoll(knob);
    if (asked == 2 || asked == 4 || asked == 8) cap = asked < cap ? asked : cap;
  }
  return p.heads < cap ? p.heads : cap;
}

// Calls fn(CPL, HM) for the smallest held-heads bound of `heads` heads a warp at p's layout (the
// instantiations: CPL 4 with 2, 4 or 8 heads, CPL 8 with 2 or 4).
template <typename Fn>
void dispatch_shared_rows(const AttentionParams& p, int64_t heads, Fn&& fn) {
  using std::integral_constant;
  if (shared_rows_cpl(p.channels) == 4) {
    if (heads <= 2) return fn(integral_constant<int, 4>{}, integral_constant<int, 2>{});
    if (heads <= 4) return fn(integral_constant<int, 4>{}, integral_constant<int, 4>{});
    return fn(integral_constant<int, 4>{}, integral_constant<int, 8>{});
  }
  if (heads <= 2) return fn(integral_constant<int, 8>{}, integral_constant<int, 2>{});
  return fn(integral_constant<int, 8>{}, integral_constant<int, 4>{});
}

// weights[k, h] held the raw score e; now p~ = exp(e - m_i) / s_i times the dropout factor.
// One thread per (slot, head); the slot's row is found by binary search in rowptr.
template <typename index_t>
__global__ void normalize_weights_kernel(AttentionParams p) {
  const auto* rowptr = static_cast<const index_t*>(p.rowptr);
  auto* weights = static_cast<float*>(p.weights);
  const auto* stats = static_cast<const float*>(p.stats);
  const int64_t n = p.nnz * p.heads;
  for (int64_t x = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; x < n;
       x += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = x / p.heads, h = x % p.heads;
    int64_t lo = 0, hi = p.num_dst;  // the last row whose start is <= k
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (int64_t(rowptr[mid]) <= k) lo = mid; else hi = mid;
    }
    const float* st = stats + (lo * p.heads + h) * 2;
    weights[x] = expf(weights[x] - st[0]) / st[1] * dropout_factor(p, k, h);
  }
}

// Workspace: the items' partial states (Partial) from byte 0, then, with heavy rows, the split's
// item_offsets table at the next 256-byte boundary.
size_t partial_bytes(const AttentionParams& p) {
  return static_cast<size_t>(p.split.num_items * p.heads * (2 + p.channels)) * sizeof(float);
}

size_t item_offsets_at(const AttentionParams& p) { return workspace_align(partial_bytes(p)); }

Partial partial_of(const AttentionParams& p, void* workspace) {
  auto* base = static_cast<float*>(workspace);
  const int64_t n = p.split.num_items * p.heads;
  return {base, base + n, base + 2 * n};
}

}  // namespace

bool attention_forward_cuda_gat_scores_from_rows(const AttentionParams& p) {
  // The kernel's message is then the row it scored (kKeyIsValue): no edge value added to it.
  if (p.kind != ScoreKind::kGat || !p.score_att || p.src_score || p.dst_score || p.edge_score ||
      p.edge_value || p.num_dst > p.num_src || p.scalar_type == ScalarType::kFloat64)
    return false;
  // head_scores' piece kernel (head_scores_piece), whose lanes are then dispatch_layout's
  // (CPL = its V, L = its G): the scores are its sums in its order.
  return head_scores_piece(p.scalar_type, p.channels, p.value) > 0 &&
         reinterpret_cast<uintptr_t>(p.score_att) % 16 == 0;
}

bool attention_forward_cuda_shared_rows(const AttentionParams& p) {
  return p.shared_kv && p.kind == ScoreKind::kDot && p.key == p.value && !p.edge_key && !p.edge_value &&
         p.scalar_type != ScalarType::kFloat64 && p.channels <= kMaxCudaChannels && p.heads >= 1 &&
         p.heads * shared_rows_cpl(p.channels) <= 32;  // (so at most 8 heads, 4 above 128 channels)
}

size_t attention_forward_cuda_workspace_bytes(const AttentionParams& p) {
  const size_t table = item_offsets_bytes(p.split);
  return table > 0 ? item_offsets_at(p) + table : partial_bytes(p);
}

void attention_forward_cuda(const AttentionParams& p, void* workspace, void* stream) {
  GNNIO_CHECK(p.scalar_type != ScalarType::kFloat64, ErrorKind::kType,
              "graph_attention on CUDA runs float32, float16 and bfloat16 (float64 runs on the CPU)");
  GNNIO_CHECK(p.channels <= kMaxCudaChannels, ErrorKind::kInvalidArgument,
              text("graph_attention on CUDA supports up to ", kMaxCudaChannels,
                   " channels per head, got ", p.channels));
  GNNIO_CHECK(!gat_scores_from_rows(p) || attention_forward_cuda_gat_scores_from_rows(p),
              ErrorKind::kInvalidArgument,
              "graph_attention: these operands need GAT's scores as tensors, not score_att");
  GNNIO_CHECK(!p.shared_kv || (attention_forward_cuda_shared_rows(p) && !p.weights),
              ErrorKind::kInvalidArgument,
              "graph_attention: these shared key and value rows need copying per head (edge terms, "
              "weights, or more heads than attention_forward_cuda_shared_rows holds)");
  if (p.num_dst == 0 || p.heads == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const Partial part = partial_of(p, workspace);
  RowSplit split = p.split;
  fill_item_offsets(split, static_cast<char*>(workspace) + item_offsets_at(p), s);
  if (p.shared_kv) {
    dispatch_cuda(p.scalar_type, p.index_type, [&](auto scalar, auto index) {
      using scalar_t = decltype(scalar);
      using index_t = decltype(index);
      if constexpr (!std::is_same_v<scalar_t, double>) {
        dispatch_shared_rows(p, shared_rows_heads_per_warp(p), [&](auto cpl, auto hm) {
          constexpr int CPL = decltype(cpl)::value, HM = decltype(hm)::value;
          AttentionParams q = p;
          q.split = split;
          q.vector_io = rows_aligned(p, CPL, {});
          set_dropout_test(q);
          const int64_t warps = (p.num_dst + p.split.num_items) * ((p.heads + HM - 1) / HM);
          shared_rows_forward_kernel<scalar_t, index_t, CPL, HM>
              <<<blocks_for(warps * 32, kRowThreads), kRowThreads, 0, s>>>(q, part);
          GNNIO_CUDA_CHECK(cudaGetLastError());
          if (p.split.num_heavy == 0) return;
          // The items' partials are forward_kernel's layout; merged with the per-head path's lane
          // groups (dispatch_layout's L), so in its order.
          // (Its CPL is this kernel's: shared_rows_cpl is dispatch_layout's choice.)
          dispatch_layout<scalar_t>(p.channels, [&](auto l, auto merge_cpl) {
            constexpr int L = decltype(l)::value, MCPL = decltype(merge_cpl)::value;
            const size_t smem = (kMergeThreads / L) * (2 + p.channels) * sizeof(float);
            merge_kernel<scalar_t, L, MCPL>
                <<<static_cast<unsigned>(p.split.num_heavy * p.heads), kMergeThreads, smem, s>>>(q, part);
            GNNIO_CUDA_CHECK(cudaGetLastError());
          });
        });
      }
    });
    return;
  }
  dispatch_attention(p, [&](auto scalar, auto index, auto l, auto cpl) {
    using scalar_t = decltype(scalar);
    using index_t = decltype(index);
    constexpr int L = decltype(l)::value, CPL = decltype(cpl)::value;
    AttentionParams q = p;
    q.split = split;
    q.vector_io = rows_aligned(p, CPL, {});
    set_dropout_test(q);
    const int64_t groups = (p.num_dst + p.split.num_items) * p.heads;
    dispatch_kind_kv<true>(p, [&](auto kind, auto key_is_value) {
      forward_kernel<decltype(kind)::value, scalar_t, index_t, L, CPL, decltype(key_is_value)::value>
          <<<blocks_for(groups * L, kRowThreads), kRowThreads, 0, s>>>(q, part);
    });
    GNNIO_CUDA_CHECK(cudaGetLastError());
    if (p.split.num_heavy > 0) {
      const size_t smem = (kMergeThreads / L) * (2 + p.channels) * sizeof(float);
      merge_kernel<scalar_t, L, CPL>
          <<<static_cast<unsigned>(p.split.num_heavy * p.heads), kMergeThreads, smem, s>>>(q, part);
      GNNIO_CUDA_CHECK(cudaGetLastError());
    }
    if (p.weights && p.nnz > 0) {  // q's split and vector_io are not read by this kernel
      normalize_weights_kernel<index_t><<<blocks_for(p.nnz * p.heads), kThreads, 0, s>>>(q);
      GNNIO_CUDA_CHECK(cudaGetLastError());
    }
  });
}

}  // namespace gnnio
