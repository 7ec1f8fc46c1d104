// The attention family: one fused CSR pass per direction for GATConv, GATv2Conv and
// TransformerConv. For each destination i, head h and CSR slot k (edge j -> i):
//
//   kGat:   e_k = LeakyReLU(src_score[j,h] + dst_score[i,h] + edge_score[k,h])
//   kGatV2: e_k = sum_c att[h,c] * LeakyReLU(key[j,h,c] + query[i,h,c] + edge_key[k,h,c])
//   kDot:   e_k = scale * sum_c query[i,h,c] * (key[j,h,c] + edge_key[k,h,c])
//
//   p_k  = exp(e_k - m_i) / s_i,  m_i = max_k e_k,  s_i = sum_k exp(e_k - m_i) + 1e-16  (PyG's softmax)
//   p~_k = p_k * keep(seed, k, h) / (1 - dropout)                               (dropout.h)
//   out[i,h,:] = sum_k p~_k * (value[j,h,:] + edge_value[k,h,:])
//
// in one streaming pass per (i, h) with an online softmax (running max, sum and accumulator),
// writing only out and stats[i,h] = (m_i, s_i); no E x H scores, no E x H x C messages. An
// empty row gives out 0 and stats (0, 1e-16). Optional operands (dst_score, edge_score,
// edge_key, edge_value) are nullptr when absent; per-edge operands are in CSR-slot order.
//
// The backward pass recomputes p_k from stats. With D_i = dout_i . out_i (dropout included; out
// unrounded, from out_acc, when the forward kept it):
//   dp~ term: de_k = p_k * (keep_k / (1 - dropout) * dout_i . (value_j + edge_value_k) - D_i)
// then the score's own chain rule. Pass A walks csr_by_dst (destination-side and per-edge
// gradients, and GATv2's per-destination share of d att), pass B walks csr_by_src (source-side
// gradients). Both are gathers: one thread owns each output, no atomics, the same bits every run.
#pragma once

#include <cstdint>

#include "gnnio/common/row_split.h"
#include "gnnio/common/types.h"

namespace gnnio {

enum class ScoreKind : int { kGat = 0, kGatV2 = 1, kDot = 2 };

struct AttentionParams {
  const void* rowptr = nullptr;  // csr_by_dst [num_dst + 1]
  const void* col = nullptr;     // [nnz] source of each slot
  IndexType index_type = IndexType::kInt64;
  ScoreKind kind = ScoreKind::kGat;
  ScalarType scalar_type = ScalarType::kFloat32;  // of every floating operand and of out

  int64_t num_dst = 0;
  int64_t num_src = 0;
  int64_t nnz = 0;
  int64_t heads = 0;
  int64_t channels = 0;

  // Score operands, contiguous: [rows, heads] (scores) or [rows, heads, channels]; att [heads, channels].
  const void* src_score = nullptr;   // kGat [num_src, H]
  const void* dst_score = nullptr;   // kGat [num_dst, H], optional
  const void* edge_score = nullptr;  // kGat [nnz, H], optional
  const void* query = nullptr;       // kGatV2, kDot [num_dst, H, C]
  const void* key = nullptr;         // kGatV2, kDot [num_src, H, C]
  const void* edge_key = nullptr;    // kGatV2, kDot [nnz, H, C], optional
  const void* att = nullptr;         // kGatV2 [H, C]
  // kGat, CUDA forward only (attention_forward_cuda_gat_scores_from_rows): [2, H, C] (a_src,
  // a_dst) in place of src_score and dst_score: src_score[j,h] = a_src[h] . value[j,h] and
  // dst_score[i,h] = a_dst[h] . value[i,h] (value's first num_dst rows are the destinations'),
  // each rounded to value's dtype, formed from the value rows the kernel gathers anyway, with
  // head_scores' lane order: the same bits as gnnio::head_scores, so that the backward can
  // recompute the scores with it. Saves the forward the scores' own pass over value and the
  // random 4-byte score load per slot, which misses L2 (NOTES v14).
  const void* score_att = nullptr;
  double negative_slope = 0.2;
  double scale = 1.0;

  const void* value = nullptr;       // [num_src, H, C] (may alias key)
  // kDot only: key and value are [num_src, 1, C], one row per source that every head reads
  // (multi-query attention), and so are their gradients (summed over the heads). Query, out
  // and the per-edge terms keep their heads. TransformerConv's reassociated form (W_k and W_v
  // moved around the aggregation) is this with key = value = x and query = W_k,h^T q_i.
  bool shared_kv = false;
  const void* edge_value = nullptr;  // [nnz, H, C], optional

  double dropout = 0.0;  // probability of dropping an attention weight, in [0, 1)
  uint64_t seed = 0;

  void* out = nullptr;      // [num_dst, H, C]
  // Optional [num_dst, H, C] float32: out before its rounding to a bf16/fp16 out (CUDA). The
  // backward's D_i = dout_i . out_i is then formed from it: with the rounded out, every de_k of
  // a row carries p_k dout . (fl(out) - out), which does not cancel over a row and dominates the
  // gradient of a super node's row.
  void* out_acc = nullptr;
  // Optional [H * C], value's dtype: a layer's output bias, added to every row of out (not of
  // out_acc) as PyG's `out + bias` rounds it, fl(fl(attention) + bias). In the store the kernel
  // makes anyway, where a separate add would read and write out again (0.38 ms at 1M x 128 fp32
  // on an H200). Set only where nothing keeps out for the backward (the autograd decides).
  const void* bias = nullptr;
  void* stats = nullptr;    // [num_dst, H, 2] float32 (float64 for float64 inputs): (m_i, s_i)
  void* weights = nullptr;  // optional [nnz, H] float32 (float64): p~_k, for return_attention_weights

  RowSplit split;  // CUDA super-node split of csr_by_dst

  // Set by the CUDA launcher (not the caller): every base pointer is 16-byte aligned and the
  // channel count a multiple of a lane's CPL, so kernels may load and store a lane's channels
  // as vectors (16 bytes, or 8 for 16-bit rows at CPL 4).
  bool vector_io = false;
  // Also set by the CUDA launcher: the dropout test of dropout.h in integers, hoisted out of the
  // per-slot loop (keep <=> (mix64(k * heads + h ^ seed_mix) >> 40) >= dropout_threshold).
  uint64_t seed_mix = 0;
  uint32_t dropout_threshold = 0;
  float dropout_scale = 1.0f;
};

struct AttentionBackwardParams {
  AttentionParams fwd;             // the forward's operands, with out and stats
  const void* grad_out = nullptr;  // [num_dst, H, C] contiguous
  const void* rowptr_t = nullptr;  // csr_by_src [num_src + 1]
  const void* col_t = nullptr;     // [nnz] destination of each transposed slot
  const void* t2c = nullptr;       // [nnz] csr_by_dst slot of each transposed slot
  RowSplit split_t;                // CUDA split of csr_by_src

  // Gradients, same shapes as their operands; nullptr = not needed. grad_key and grad_value
  // are separate outputs when key and value alias unless key_grad_into_value is set.
  void* grad_src_score = nullptr;
  void* grad_dst_score = nullptr;
  void* grad_edge_score = nullptr;
  void* grad_query = nullptr;
  void* grad_key = nullptr;
  void* grad_edge_key = nullptr;
  void* grad_att_partial = nullptr;  // [num_dst, H, C] accumulator type: row i's share of d att
  void* grad_value = nullptr;
  void* grad_edge_value = nullptr;
  void* delta = nullptr;             // workspace [num_dst, H] accumulator type: D_i
  // key is value (GATv2's x_l): pass B adds the key's gradient into grad_value (summed in the
  // accumulator type, rounded once) and grad_key stays nullptr: one [num_src, H, C] buffer and
  // one add fewer than autograd summing two.
  bool key_grad_into_value = false;
  // grad_att_partial's layout. 0: one row per destination, [num_dst, H, C]. Else (CUDA, from
  // attention_backward_cuda_att_blocks) one row per pass-A block then one per heavy row,
  // [att_blocks + split.num_heavy, H, C]: the same sum, 1/(rows per block) of the memory.
  int64_t att_blocks = 0;
  // GAT on CUDA (attention_backward_cuda_gat_slot_grads): pass B writes each slot's d score
  // gz [nnz, H] float32 here (inside the workspace, or grad_edge_score itself when that is
  // float32) and d dst_score is summed from it per destination, instead of pass A gathering a
  // value row per edge again. Set by attention_backward_cuda, not by the caller.
  float* slot_grad = nullptr;
  // Whether that path runs: the caller sets it once from attention_backward_cuda_gat_slot_grads
  // (an environment knob), and both the workspace size and the launch read this field.
  bool gat_slot_grads = false;
  // delta already holds D_i for this out and grad_out (a second call of the same backward, for
  // the other pass): delta_kernel is skipped.
  bool delta_ready = false;
  // No out (CUDA GATv2, attention_backward_cuda_delta_in_pass_a): pass A forms D_i itself while
  // it walks each row, writes it to delta and corrects its sums at the end of the row (see
  // pass_a_kernel), and pass B reads it. The forward then never keeps out.
  bool delta_in_pass_a = false;
};

void attention_forward_cpu(const AttentionParams& p);
void attention_backward_cpu(const AttentionBackwardParams& b);

#ifdef GNNIO_WITH_CUDA
// Workspace bytes for the super-node partials of the forward / backward.
size_t attention_forward_cuda_workspace_bytes(const AttentionParams& p);
size_t attention_backward_cuda_workspace_bytes(const AttentionBackwardParams& b);
// att_blocks for b (grad_att_partial's per-block layout), or 0 for the per-destination one.
int64_t attention_backward_cuda_att_blocks(const AttentionBackwardParams& b);
// Whether GAT's destination-side gradients come from pass B's per-slot values (see slot_grad).
bool attention_backward_cuda_gat_slot_grads(const AttentionBackwardParams& b);
// Policy, decided by the forward: whether a CUDA backward with these gradients forms D_i inside
// pass A (delta_in_pass_a), so that the forward need not keep out for it.
bool attention_backward_cuda_delta_in_pass_a(ScoreKind kind, bool grad_query, bool grad_att,
                                             bool grad_edge_key, bool grad_edge_value);
// Whether the CUDA forward can form kind gat's scores from the value rows (score_att) for these
// operands (p.score_att set, src_score and dst_score not): no edge score or edge value, num_dst <= num_src,
// and the lane layout of head_scores' piece kernel (head_scores_piece: value 16-byte aligned,
// channels at most 32 whole pieces; score_att 16-byte aligned too), so that the scores are
// head_scores' bits. The binding otherwise computes the scores with head_scores first.
bool attention_forward_cuda_gat_scores_from_rows(const AttentionParams& p);
// Whether the CUDA forward reads p's shared key and value rows once per slot for all heads
// (shared_rows_forward_kernel): shared_kv with key == value (one row scored and summed), no edge
// terms, not float64, and a query and an accumulator per head in registers (heads x 4 <= 32 up
// to 128 channels, heads x 8 <= 32 up to 256). It also takes no weights. The binding otherwise
// copies the rows per head, and does so for every backward.
bool attention_forward_cuda_shared_rows(const AttentionParams& p);
void attention_forward_cuda(const AttentionParams& p, void* workspace, void* stream);
void attention_backward_cuda(const AttentionBackwardParams& b, void* workspace, void* stream);
// D_i = dout_i . out_i (float32, b.delta) alone, in the backward's own lane order: reads only
// fwd.{out or out_acc, num_dst, heads, channels, scalar_type} and grad_out.
void attention_delta_cuda(const AttentionBackwardParams& b, void* stream);
#endif

}  // namespace gnnio
