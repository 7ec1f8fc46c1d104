// What both passes of the attention backward share (cuda_backward.cu: delta, pass A, the slot
// sums and the launcher; cuda_backward_pass_b.cu: pass B and its merge): where a task's slots
// are, and a slot's weight and score gradient recomputed from the forward's stats. Two
// translation units, so that the two largest kernels' instantiations compile in parallel.
#pragma once

#include <cuda_runtime.h>

#include "gnnio/attention/backward_merge.cuh"
#include "gnnio/attention/score.cuh"

namespace gnnio {
namespace attention_detail {

// Where a task of a split CSR starts and ends; false for a heavy row (its items cover it).
// Work items come first (the longest tasks start in the first waves), then the rows.
template <typename index_t>
__device__ inline bool task_range(const void* rowptr_v, const RowSplit& split, int64_t task,
                                  int64_t& row, int64_t& begin, int64_t& end) {
  const auto* rowptr = static_cast<const index_t*>(rowptr_v);
  if (task >= split.num_items) {
    row = task - split.num_items;
    begin = rowptr[row];
    end = rowptr[row + 1];
    return end - begin <= split.light_max_degree;
  }
  const int64_t* it = split.heavy_items + task * 3;
  row = split.heavy_rows[it[0]];
  begin = it[1];
  end = it[2];
  return true;
}

// r g_k = dout_i . (r v_k) of slot k (head h), with r its dropout factor.
template <typename scalar_t, int L, int CPL>
__device__ inline float slot_rg(const AttentionParams& p, const Group<L>& g, const float (&gi)[CPL],
                                const float (&v)[CPL], int64_t k, int64_t h, float& r) {
  r = dropout_factor(p, k, h);
  // r applied per channel and rounded as the forward's acc was (fl(r v) for a one-edge row),
  // then summed in delta_kernel's lane order: a one-edge row's r g - D is then exactly 0, as in
  // PyTorch, instead of the rounding noise of an fma of r * g - D (seen with dropout on).
  float part = 0.0f;
#pragma unroll
  for (int t = 0; t < CPL; ++t) part += gi[t] * (r * v[t]);
  return g.sum(part);
}

// Slot k's weight p_k from its loaded key and row i's stats (m, s); z as score_of leaves it.
template <ScoreKind K, typename scalar_t, int L, int CPL>
__device__ inline float slot_prob(const AttentionParams& p, const Group<L>& g,
                                  const DstSide<scalar_t, CPL>& d, float m, float s,
                                  const float (&kk)[CPL], float (&z)[CPL]) {
  return expf(score_of<K, scalar_t, L, CPL>(p, g, d, kk, z) - m) / s;
}

// de_k = p_k (r g_k - D_i) of slot k; prob_r = p_k r.
template <ScoreKind K, typename scalar_t, int L, int CPL>
__device__ inline float slot_grad(const AttentionParams& p, const Group<L>& g,
                                  const DstSide<scalar_t, CPL>& d, const float (&gi)[CPL],
                                  float m, float s, float delta, const float (&kk)[CPL],
                                  const float (&v)[CPL], int64_t k, int64_t h, float (&z)[CPL],
                                  float& prob_r) {
  float r;
  const float prob = slot_prob<K, scalar_t, L, CPL>(p, g, d, m, s, kk, z);
  const float rg = slot_rg<scalar_t, L, CPL>(p, g, gi, v, k, h, r);
  prob_r = prob * r;
  return prob * (rg - delta);
}

// Pass B over csr_by_src and, for split_t's heavy sources, its merge (cuda_backward_pass_b.cu):
// q as the launcher prepared it (dropout test, vector_io), part_b its share of the workspace,
// split_t with its item_offsets table filled.
void attention_pass_b_cuda(const AttentionBackwardParams& q, const RowSplit& split_t,
                           const Partials& part_b, cudaStream_t stream);

}  // namespace attention_detail
}  // namespace gnnio
