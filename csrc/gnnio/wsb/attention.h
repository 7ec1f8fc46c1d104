// GAT attention on WSB tiles (params.h): the softmax-weighted sum P · V of each 16-row block
// taken as dense 16 x 16 tile products on tensor cores, FlashAttention's shape on a block-sparse
// mask. For destination i, head h and source j with c_ij >= 1 edges j -> i (duplicates are
// separate softmax terms of one score, so a tile entry holds their count):
//
//   z_ij = src_score[j,h] + dst_score[i,h],  e_ij = LeakyReLU(z_ij)
//   m_i = max_j e_ij,  s_i = sum_j c_ij exp(e_ij - m_i) + 1e-16        (PyG's softmax)
//   P_ij = c_ij exp(e_ij - m_i) / s_i,  out[i,h,:] = sum_j P_ij value[j,h,:]
//
// stats[i,h] = (m_i, s_i) as the CSR attention kernels store them (an empty row: (0, 1e-16),
// out 0). The forward makes two passes over a block row's tiles: the scores alone (scalars: the
// count tile and 16 source scores) for (m, s), then P · V with P final, so the accumulator is
// never rescaled (its fragment layout is the MMA's, not ours). The backward, with
// D_i = dout_i . out_i and dP_ij = dout_i . value_j (a tile product too):
//
//   dE_ij = P_ij (dP_ij - D_i),  dZ_ij = dE_ij LeakyReLU'(z_ij)
//   d dst_score[i] = sum_j dZ_ij  (pass A, by block row: no atomics), formed as
//     sum_j P_ij dP_ij lk_ij - D_i sum_j P_ij lk_ij with D_i = sum_j P_ij dP_ij (= dout_i . out_i,
//     lk = LeakyReLU'): no read of out; pass A writes D_i for pass B (without pass A, a
//     separate D_i = dout_i . out_i)
//   d src_score[j] = sum_i dZ_ij,  d value[j] = sum_i P_ij dout_i  (pass B, over the tiles of
//   the transposed matrix, csr_by_src's WSB: one owner per source block, no atomics)
//
// What this does not take (the binding falls back to the CSR kernels): edge scores or edge
// values (a duplicate edge's terms would differ), dropout (a mask per edge), returned weights,
// other score kinds, more than kWsbAttentionMaxChannels channels a head. Every stored entry of a
// tile is multiplied, so (as in wsb_spmm) a non-finite value row spreads through its tiles. A
// row whose every score is -inf gets NaN, as PyG's softmax gives it (exp(-inf - -inf)).
#pragma once

#include <cstdint>

#include "gnnio/common/types.h"
#include "gnnio/wsb/params.h"

namespace gnnio {

// A head's 16 x C operand blocks are staged whole in shared memory (policy.h sizes them).
inline constexpr int kWsbAttentionMaxChannels = 128;

struct WsbAttentionParams {
  const void* block_rowptr = nullptr;  // WSB of csr_by_dst's matrix (rows = destinations)
  const void* block_col = nullptr;
  IndexType index_type = IndexType::kInt64;
  const float* count = nullptr;  // [num_tiles, 16, 16] edges per entry (0 = none), float32
  int64_t num_tiles = 0;

  ScalarType scalar_type = ScalarType::kFloat32;  // of the scores, value and out
  int64_t num_dst = 0;
  int64_t num_src = 0;
  int64_t heads = 0;
  int64_t channels = 0;

  const void* src_score = nullptr;  // [num_src, H]
  const void* dst_score = nullptr;  // [num_dst, H], optional
  double negative_slope = 0.2;
  const void* value = nullptr;  // [num_src, H, C] contiguous

  void* out = nullptr;      // [num_dst, H, C]
  void* out_acc = nullptr;  // optional [num_dst, H, C] float32: out before its rounding (16-bit)
  void* stats = nullptr;    // [num_dst, H, 2] float32 (float64 for float64)
};

struct WsbAttentionBackwardParams {
  WsbAttentionParams fwd;  // the forward's operands with out (or out_acc) and stats
  const void* grad_out = nullptr;  // [num_dst, H, C] contiguous

  const void* block_rowptr_t = nullptr;  // WSB of the transpose (rows = sources)
  const void* block_col_t = nullptr;
  const float* count_t = nullptr;  // [num_tiles, 16, 16]: entry (r, c) of tile (source block,
                                   // destination block) counts the edges 16 sb + r -> 16 db + c

  void* delta = nullptr;  // workspace [num_dst, H] float32 (float64): D_i

  void* grad_src_score = nullptr;  // nullptr = not needed
  void* grad_dst_score = nullptr;
  void* grad_value = nullptr;
};

// CPU: the same two-pass tiled algorithm, entry by entry (entries with no edge skipped: the
// products a tensor core makes with them are zeros), float32 or float64 throughout.
void wsb_attention_forward_cpu(const WsbAttentionParams& p);
void wsb_attention_backward_cpu(const WsbAttentionBackwardParams& b);

#ifdef GNNIO_WITH_CUDA
// Tensor cores (nvcuda::wmma) for P · V, dout · valueᵀ and Pᵀ · dout: float32 operands as tf32,
// float16 / bfloat16 as they are (P in float16 scaled by 2^15, out of the subnormals), float32
// accumulation; scores, softmax and sums in float32.
// float64 is refused (InvalidArgument), as in wsb_spmm_cuda.
void wsb_attention_forward_cuda(const WsbAttentionParams& p, void* stream);
void wsb_attention_backward_cuda(const WsbAttentionBackwardParams& b, void* stream);
#endif

}  // namespace gnnio
