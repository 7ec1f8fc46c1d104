// TransformerConv's attention in the reassociated form, fused into one pass per tile of
// destinations (gnnio.nn.TransformerConv, form "fused"). For destination i, head h, and its
// in-edges j (CSR slots of csr_by_dst):
//
//   q~_i,h   = W_k,h^T q_i,h                       [F]   (W_k,h: the head's C rows of lin_key)
//   e_ij,h   = scale * q~_i,h . x_j                        (the key bias shifts a row's scores
//                                                          equally: the softmax drops it)
//   x~_i,h   = sum_j softmax_j(e_ij,h) x_j         [F]   (PyG's softmax: exp / (sum + 1e-16))
//   out_i,h  = W_v,h x~_i,h + b_v [if i has edges] (+ residual_i,h)
//
// Per tile the kernel forms q~ of its rows in shared memory (an FFMA GEMM against W_k), walks
// each row's edges once for all heads (x_j gathered once per edge: F values, where the direct
// form gathers a key and a value row of H x C each), and applies W_v to x~ in shared memory: no
// [N, H, F] tensor goes through global memory (the unfused reassociated form writes and reads
// two; bench/NOTES.md v19-v21). Writes out and the softmax statistics (m_i,h, s_i,h) that the
// direct form's backward recomputes the weights from.
//
// The order of the sums (what the CPU kernel follows): q~ over c ascending; a score as four
// partial sums, quarter g of the features f with (f / 4) % 4 == g (each in order), added
// (q0 + q1) + (q2 + q3) (CUDA sums a score otherwise: 32 partial sums of 4 features each, over
// 4 l .. 4 l + 3, added as a butterfly tree over the lanes; cuda.cu walk_registers); a row
// walked in chunks of kTransformerChunk slots, each chunk's max taken first, the running sum and
// x~ rescaled by exp(m_old - m_new) once per chunk; x~ accumulated slot by slot; the running sum
// kept per position in the chunk and added at the end as a tree ((s0 + s1) + (s2 + s3)) + ...;
// out over f ascending. Heavy rows (CUDA, RowSplit) are walked in items (each item's chunks start
// at its first slot) whose partials are merged per head in a fixed order that is not item order:
// merge group g merges items g, g + 16, g + 32, ... online (each item rescaled to the running
// max), then the 16 groups' results are added in group order (merge_kernel); the CPU kernel
// walks a heavy row whole, so its sums are ordered otherwise.
#pragma once

#include <cstdint>

#include "gnnio/common/row_split.h"
#include "gnnio/common/types.h"

namespace gnnio {

// Slots a warp scores at once (each lane holds its 4 features of all 8).
inline constexpr int kTransformerChunk = 8;

struct TransformerFusedParams {
  const void* rowptr = nullptr;  // csr_by_dst [num_dst + 1]
  const void* col = nullptr;     // [nnz]
  IndexType index_type = IndexType::kInt64;
  ScalarType scalar_type = ScalarType::kFloat32;  // of every floating operand, out and stats

  int64_t num_dst = 0;
  int64_t num_src = 0;
  int64_t heads = 0;
  int64_t channels = 0;  // C per head
  int64_t features = 0;  // F of x

  const void* x = nullptr;          // [num_src, F] contiguous: every head's key and value row
  const void* query = nullptr;      // [num_dst, H * C] contiguous (lin_query's output)
  const void* w_key = nullptr;      // [H * C, F] contiguous (lin_key.weight)
  const void* w_value_t = nullptr;  // [F, H * C] contiguous (lin_value.weight transposed)
  const void* b_value = nullptr;    // [H * C] or nullptr
  const void* residual = nullptr;   // [num_dst, H * C] contiguous or nullptr (lin_skip's output)
  // [H * C] or nullptr (lin_key.bias): not in out (the softmax drops it), but added to stats' max
  // as scale q_i,h . b_k,h, so that stats are the direct form's, which its backward reads.
  const void* b_key = nullptr;
  double scale = 1.0;

  // [num_dst, H * C]; may be residual itself (out written in place: transformer_fused_inference)
  void* out = nullptr;
  // [num_dst, H, 2]: (m + scale q . b_k, s), as the direct form's graph_attention's; nullptr: not
  // formed (a call without a backward)
  void* stats = nullptr;

  // CUDA: heavy rows walked in items (item_offsets is filled by the launcher, in its workspace)
  RowSplit split;
};

void transformer_fused_forward_cpu(const TransformerFusedParams& p);

#ifdef GNNIO_WITH_CUDA
// Whether the CUDA kernel takes these operands: float32, F = H x C = 128, 1, 2 or 4 heads, every
// pointer 16-byte aligned. The layer falls back to the unfused forms otherwise.
bool transformer_fused_cuda_supported(const TransformerFusedParams& p);
// Workspace: the heavy rows' item partials, their q~ and x~, the item offsets, the list of light
// rows with edges and CUB's select storage (cuda.cu, Workspace).
size_t transformer_fused_cuda_workspace_bytes(const TransformerFusedParams& p);
void transformer_fused_forward_cuda(const TransformerFusedParams& p, void* workspace, void* stream);
#endif

}  // namespace gnnio
