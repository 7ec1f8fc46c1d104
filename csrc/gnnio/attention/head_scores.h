// GAT's per-node attention scores, fused: score[a, n, h] = sum_c x[n, h, c] * att[a, h, c]
// for one or two attention vectors a (GATConv's a_src and a_dst over one projection). PyTorch
// computes each as (x * att).sum(-1): an N x H x C product written and read back, and in the
// backward two more N x H x C temporaries per vector. Here the forward reads x once and writes
// A x N x H scores (score[a] is vector a's [N, H], contiguous); the backward reads x once, writes d x once and sums d att per chunk of
// kHeadScoreChunkRows rows, in row order, into per-chunk partials that the caller adds in a
// fixed order (deterministic, no atomics; the same chunks on every device).
#pragma once

#include <cstdint>

#include "gnnio/common/types.h"

namespace gnnio {

inline constexpr int64_t kHeadScoreChunkRows = 64;

inline int64_t head_score_chunks(int64_t num_rows) {
  return (num_rows + kHeadScoreChunkRows - 1) / kHeadScoreChunkRows;
}

struct HeadScoresParams {
  const void* x = nullptr;    // [num_rows, heads, channels] contiguous, scalar_type
  const void* att = nullptr;  // [num_att, heads, channels] contiguous, accumulator type
  void* score = nullptr;      // [num_att, num_rows, heads] contiguous, accumulator type
  ScalarType scalar_type = ScalarType::kFloat32;  // x's; accumulator: float64 for float64, else float32
  int64_t num_rows = 0;
  int64_t num_att = 0;
  int64_t heads = 0;
  int64_t channels = 0;
};

struct HeadScoresBackwardParams {
  const void* x = nullptr;           // as in the forward
  const void* att = nullptr;         // as in the forward
  const void* grad_score = nullptr;  // [num_att, num_rows, heads] contiguous, accumulator type
  // d x[n, h, c] = sum_a grad_score[a, n, h] * att[a, h, c]: [num_rows, heads, channels] in x's
  // type, or null when not needed.
  void* grad_x = nullptr;
  // grad_x already holds a gradient of x that d x is added to: grad_x = fl(grad_x + fl(d x)),
  // autograd's sum of the two in x's type, without a buffer for d x alone.
  bool grad_x_accumulate = false;
  // [head_score_chunks(num_rows), num_att, heads * channels], accumulator type: chunk k's
  // sum over its rows n of grad_score[a, n, h] * x[n, h, c]; or null when not needed.
  void* att_partials = nullptr;
  ScalarType scalar_type = ScalarType::kFloat32;
  int64_t num_rows = 0;
  int64_t num_att = 0;
  int64_t heads = 0;
  int64_t channels = 0;
};

// Channels a lane holds in head_scores' CUDA piece kernel for `channels` of `type` read from x,
// or 0 where it takes the column kernel (a lane strides over single channels): 4 (16 bytes of
// float32, 8 of a 16-bit type; 2 for float64), 8 for 16-bit heads of 129 to 256 channels; the
// channels a whole number of at most 32 pieces, x 16-byte aligned. These are the attention
// kernels' lanes (score.cuh's dispatch_layout), so that GAT's scores formed from the rows in the
// attention forward are head_scores' sums in head_scores' order (cuda_forward.cu).
inline int head_scores_piece(ScalarType type, int64_t channels, const void* x) {
  const int v = type == ScalarType::kFloat64 ? 2
                : (type != ScalarType::kFloat32 && channels > 128) ? 8 : 4;
  if (channels <= 0 || channels % v != 0 || channels / v > 32 ||
      reinterpret_cast<uintptr_t>(x) % 16 != 0)
    return 0;
  return v;
}

void head_scores_cpu(const HeadScoresParams& p);
void head_scores_backward_cpu(const HeadScoresBackwardParams& p);

#ifdef GNNIO_WITH_CUDA
void head_scores_cuda(const HeadScoresParams& p, void* stream);
void head_scores_backward_cuda(const HeadScoresBackwardParams& p, void* stream);
#endif

}  // namespace gnnio
