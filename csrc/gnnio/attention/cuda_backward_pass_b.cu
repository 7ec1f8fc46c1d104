// Pass B of the attention backward (see cuda_backward.cu for the whole): per (source, head),
// over csr_by_src and through t2c to each edge's slot, the same recomputation as pass A, summing
// the source-side gradients (d src score, d value, d key); a heavy source's work items leave
// partials that merge_kernel adds in item order. Its own translation unit (backward_common.cuh).
#include <type_traits>

#include "gnnio/attention/backward_common.cuh"
#include "gnnio/common/cuda_check.h"

namespace gnnio {
namespace attention_detail {
namespace {

template <ScoreKind K, typename scalar_t, typename index_t, int L, int CPL, bool kKeyIsValue>
__global__ void __launch_bounds__(kRowThreads, row_blocks(CPL >= 8 ? 2 : 3)) pass_b_kernel(AttentionBackwardParams b, Partials part) {
  const AttentionParams& p = b.fwd;
  const Group<L> g;
  const int64_t group = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / L;
  const int64_t task = group / p.heads, h = group % p.heads;
  if (task >= p.num_src + b.split_t.num_items) return;
  int64_t j, begin, end;
  if (!task_range<index_t>(b.rowptr_t, b.split_t, task, j, begin, end)) return;
  const auto* col_t = static_cast<const index_t*>(b.col_t);
  const auto* t2c = static_cast<const index_t*>(b.t2c);
  const int64_t H = p.heads, C = p.channels, c0 = int64_t(g.sub) * CPL;
  const float slope = static_cast<float>(p.negative_slope), scale = static_cast<float>(p.scale);
  const bool vec = p.vector_io;
  // Source j's own operands are the same for every slot of the task: loaded once.
  float key_j[CPL] = {}, value_j[CPL], att[CPL] = {};
  if constexpr (K == ScoreKind::kGat) {
    key_j[0] = to_acc(static_cast<const scalar_t*>(p.src_score)[j * H + h]);
  } else {
    load_channels<scalar_t, CPL>(static_cast<const scalar_t*>(p.key) + (j * H + h) * C, c0, C, vec, key_j);
  }
  if constexpr (kKeyIsValue) {
#pragma unroll
    for (int t = 0; t < CPL; ++t) value_j[t] = key_j[t];
  } else {
    load_channels<scalar_t, CPL>(static_cast<const scalar_t*>(p.value) + (j * H + h) * C, c0, C, vec, value_j);
  }
  if constexpr (K == ScoreKind::kGatV2)
    load_channels<scalar_t, CPL>(static_cast<const scalar_t*>(p.att) + h * C, c0, C, vec, att);
  const bool edge_terms = !kKeyIsValue && (p.edge_score || p.edge_key || p.edge_value);
  float g_score = 0.0f, gval[CPL], gkey[CPL];
#pragma unroll
  for (int t = 0; t < CPL; ++t) gval[t] = gkey[t] = 0.0f;
  // Half the forward's slots in flight: each slot brings a dout row and the destination's
  // stats, and more would spill.
  constexpr int U = kSlotsInFlight<K, CPL> / 2 >= 2 ? kSlotsInFlight<K, CPL> / 2 : 2;
  using Batch = SlotBatch<index_t, L, U>;
  // Slots u0 .. u0 + n - 1 of the batch at base: each slot's destination-side loads (query or
  // score, dout, stats, D) first, then the arithmetic.
  auto step = [&](const Batch& dst_of, const Batch& slot_of, int64_t base, int u0, int n) {
    DstSide<scalar_t, CPL> d[U];
    float gi[U][CPL], m[U], s[U], delta[U];
    int64_t k[U];
    // 16-bit rows are loaded raw and converted after the step's last load (score.cuh's Raw);
    // float32 rows need no conversion (and this order keeps ptxas' allocation).
    constexpr bool kRaw = sizeof(scalar_t) == 2;
    Raw<scalar_t, CPL> rq[kRaw ? U : 1], rg[kRaw ? U : 1];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t i = dst_of.get(g, u0, u);
      k[u] = slot_of.get(g, u0, u);
      const auto* g_row = static_cast<const scalar_t*>(b.grad_out) + (i * H + h) * C;
      if constexpr (K == ScoreKind::kGat) {
        const auto* ds = static_cast<const scalar_t*>(p.dst_score);
        if constexpr (kRaw) rq[u].w[0] = ds ? bits_of(ds[i * H + h]) : 0u;
        else d[u].score = ds ? to_acc(ds[i * H + h]) : 0.0f;
      } else {
        const auto* q_row = static_cast<const scalar_t*>(p.query) + (i * H + h) * C;
        if constexpr (kRaw) load_raw<scalar_t, CPL>(q_row, c0, C, vec, rq[u]);
        else load_channels<scalar_t, CPL>(q_row, c0, C, vec, d[u].q);
      }
      if constexpr (kRaw) load_raw<scalar_t, CPL>(g_row, c0, C, vec, rg[u]);
      else load_channels<scalar_t, CPL>(g_row, c0, C, vec, gi[u]);
      const float2 st = *reinterpret_cast<const float2*>(static_cast<const float*>(p.stats) + (i * H + h) * 2);
      m[u] = st.x;
      s[u] = st.y;
      delta[u] = static_cast<const float*>(b.delta)[i * H + h];
    }
    if constexpr (kRaw) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if constexpr (K == ScoreKind::kGat) {
          d[u].score = raw_at(rq[u], 0);
        } else {
          to_floats(rq[u], d[u].q);
        }
        to_floats(rg[u], gi[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (u >= n) continue;  // uniform across the group
      float kk[CPL], v[CPL], z[CPL], prob_r;
#pragma unroll
      for (int t = 0; t < CPL; ++t) kk[t] = key_j[t], v[t] = value_j[t];
      if (edge_terms) {  // the edge's own terms: rare, loaded here
        float ek[CPL];
        if constexpr (K == ScoreKind::kGat) {
          if (p.edge_score) kk[0] += to_acc(static_cast<const scalar_t*>(p.edge_score)[k[u] * H + h]);
        } else if (p.edge_key) {
          load_channels<scalar_t, CPL>(static_cast<const scalar_t*>(p.edge_key) + (k[u] * H + h) * C, c0, C, vec, ek);
#pragma unroll
          for (int t = 0; t < CPL; ++t) kk[t] += ek[t];
        }
        if (p.edge_value) {
          load_channels<scalar_t, CPL>(static_cast<const scalar_t*>(p.edge_value) + (k[u] * H + h) * C, c0, C, vec, ek);
#pragma unroll
          for (int t = 0; t < CPL; ++t) v[t] += ek[t];
        }
      }
#pragma unroll
      for (int t = 0; t < CPL; ++t) d[u].att[t] = att[t];
      const float de = slot_grad<K, scalar_t, L, CPL>(p, g, d[u], gi[u], m[u], s[u], delta[u], kk,
                                                   v, k[u], h, z, prob_r);
#pragma unroll
      for (int t = 0; t < CPL; ++t) gval[t] += prob_r * gi[u][t];
      if constexpr (K == ScoreKind::kGat) {
        const float gz = de * (z[0] > 0.0f ? 1.0f : slope);
        g_score += gz;
        if (b.slot_grad && g.sub == 0) b.slot_grad[k[u] * H + h] = gz;
        continue;
      }
#pragma unroll
      for (int t = 0; t < CPL; ++t)
        gkey[t] += K == ScoreKind::kGatV2 ? de * att[t] * (z[t] > 0.0f ? 1.0f : slope)
                                          : de * scale * d[u].q[t];
    }
  };
  for (int64_t base = begin; base < end; base += Batch::kSize) {
    Batch dst_of, slot_of;
    dst_of.load(col_t, base, begin, end, g.sub);
    slot_of.load(t2c, base, begin, end, g.sub);
    const int count = end - base < Batch::kSize ? static_cast<int>(end - base) : Batch::kSize;
    if constexpr (Batch::kPerLane > 1) {
      step(dst_of, slot_of, base, 0, count);
    } else {
#pragma unroll 1
      for (int u0 = 0; u0 < count; u0 += U) step(dst_of, slot_of, base, u0, count - u0 < U ? count - u0 : U);
    }
  }
  if (b.key_grad_into_value) {
#pragma unroll
    for (int t = 0; t < CPL; ++t) gval[t] += gkey[t];
  }
  if (task < b.split_t.num_items) {
    float* slot = part.base + (task * H + h) * part.stride;
    if (g.sub == 0) slot[0] = g_score;
    store_acc_row(slot + 1, g, C, gval);
    store_acc_row(slot + 1 + C, g, C, gkey);
    return;
  }
  if (b.grad_src_score && g.sub == 0)
    static_cast<scalar_t*>(b.grad_src_score)[j * H + h] = from_acc<scalar_t>(g_score);
  store_row<scalar_t, L, CPL>(b.grad_value, (j * H + h) * C, g, C, p.vector_io, gval);
  store_row<scalar_t, L, CPL>(b.grad_key, (j * H + h) * C, g, C, p.vector_io, gkey);
}

}  // namespace

void attention_pass_b_cuda(const AttentionBackwardParams& q, const RowSplit& split_t,
                           const Partials& part_b, cudaStream_t s) {
  const AttentionParams& p = q.fwd;
  dispatch_attention(p, [&](auto scalar, auto index, auto l, auto cpl) {
    using scalar_t = decltype(scalar);
    using index_t = decltype(index);
    constexpr int L = decltype(l)::value, CPL = decltype(cpl)::value;
    const int64_t H = p.heads;
    dispatch_kind_kv(p, [&](auto kind, auto key_is_value) {
      pass_b_kernel<decltype(kind)::value, scalar_t, index_t, L, CPL, decltype(key_is_value)::value>
          <<<blocks_for((p.num_src + q.split_t.num_items) * H * L, kRowThreads), kRowThreads, 0, s>>>(q, part_b);
    });
    if (q.split_t.num_heavy > 0) {
      const size_t smem = (kMergeThreads / L) * part_b.stride * sizeof(float);
      merge_kernel<scalar_t, L, CPL><<<static_cast<unsigned>(q.split_t.num_heavy * H), kMergeThreads, smem, s>>>(
          split_t, part_b, H, p.channels, p.vector_io, q.grad_src_score, q.grad_value, q.grad_key, false, -1);
    }
    GNNIO_CUDA_CHECK(cudaGetLastError());
  });
}

}  // namespace attention_detail
}  // namespace gnnio
