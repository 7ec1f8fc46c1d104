// The attention family, GAT scores: for each destination i, head h and incoming edge j -> i,
//   e_ij = LeakyReLU(alpha_src[j, h] + alpha_dst[i, h]),  p_ij = softmax_j(e_ij),
//   out[i, h, :] = sum_j p_ij h_src[j, h, :],
// in one streaming pass per (i, h) with an online softmax (running max and sum), writing only
// out and the softmax statistics stats[i, h] = (max_j e_ij, sum_j exp(e_ij - max) + 1e-16); no
// E x H scores and no E x H x C messages. The softmax follows PyG: the max is subtracted, the
// sum gets + 1e-16, an empty row gives 0. (max, sum) rather than one log-sum-exp: the max is an
// exact score, so p_ij = exp(e_ij - max) / sum is recomputed to a few ulp, where exp(e_ij - lse)
// would lose |lse| ulp.
// The backward pass recomputes p_ij from stats: pass A over csr_by_dst gives D_i = dout_i . out_i
// and d alpha_dst; pass B over csr_by_src gives d h_src and d alpha_src. Both are gathers: one
// thread owns each output, no atomics, the same result every run.
#pragma once

#include <cstdint>

#include "gnnio/common/types.h"

namespace gnnio {

struct GatParams {
  const void* rowptr = nullptr;  // csr_by_dst [num_dst + 1]
  const void* col = nullptr;     // [nnz] source of each slot
  IndexType index_type = IndexType::kInt64;

  const void* alpha_src = nullptr;  // [num_src, heads]
  const void* alpha_dst = nullptr;  // [num_dst, heads], or nullptr (bipartite without x_dst)
  const void* h_src = nullptr;      // [num_src, heads, channels] contiguous
  void* out = nullptr;              // [num_dst, heads, channels]
  void* stats = nullptr;            // [num_dst, heads, 2] (max, sum), same dtype as out
  ScalarType scalar_type = ScalarType::kFloat32;

  int64_t num_dst = 0;
  int64_t num_src = 0;
  int64_t heads = 0;
  int64_t channels = 0;
  double negative_slope = 0.2;
};

struct GatBackwardParams {
  GatParams fwd;                  // the forward's inputs, out and stats
  const void* rowptr_t = nullptr;  // csr_by_src [num_src + 1]
  const void* col_t = nullptr;     // [nnz] destination of each transposed slot
  const void* grad_out = nullptr;  // [num_dst, heads, channels] contiguous

  void* grad_h_src = nullptr;      // [num_src, heads, channels]
  void* grad_alpha_src = nullptr;  // [num_src, heads]
  void* grad_alpha_dst = nullptr;  // [num_dst, heads] or nullptr
  void* delta = nullptr;           // workspace [num_dst, heads] float64: D_i = dout_i . out_i
};

void gat_forward_cpu(const GatParams& p);
void gat_backward_cpu(const GatBackwardParams& p);

}  // namespace gnnio
