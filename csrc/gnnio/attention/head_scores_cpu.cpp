// CPU implementation of the fused GAT scores (head_scores.h): the same per-row dot products
// and the same per-chunk d att partials as the CUDA kernels.
#include "gnnio/attention/head_scores.h"

#include "gnnio/common/cpu_dispatch.h"

namespace gnnio {
namespace {

template <typename scalar_t>
void forward(const HeadScoresParams& p) {
  const auto* x = static_cast<const scalar_t*>(p.x);
  const auto* att = static_cast<const scalar_t*>(p.att);
  auto* score = static_cast<scalar_t*>(p.score);
  const int64_t H = p.heads, C = p.channels, A = p.num_att;
#pragma omp parallel for schedule(static) if (worth_threads(p.num_rows * H * C * A))
  for (int64_t n = 0; n < p.num_rows; ++n) {
    for (int64_t a = 0; a < A; ++a) {
      for (int64_t h = 0; h < H; ++h) {
        const scalar_t* xr = x + (n * H + h) * C;
        const scalar_t* ar = att + (a * H + h) * C;
        scalar_t acc = 0;
        for (int64_t c = 0; c < C; ++c) acc += xr[c] * ar[c];
        score[(a * p.num_rows + n) * H + h] = acc;
      }
    }
  }
}

template <typename scalar_t>
void backward(const HeadScoresBackwardParams& p) {
  const auto* x = static_cast<const scalar_t*>(p.x);
  const auto* att = static_cast<const scalar_t*>(p.att);
  const auto* g = static_cast<const scalar_t*>(p.grad_score);
  auto* grad_x = static_cast<scalar_t*>(p.grad_x);
  auto* partials = static_cast<scalar_t*>(p.att_partials);
  const int64_t H = p.heads, C = p.channels, A = p.num_att, HC = H * C, NH = p.num_rows * H;
  const int64_t chunks = head_score_chunks(p.num_rows);
  constexpr int64_t kMaxAtt = 4;  // the op takes 1 to 4 vectors
  constexpr int64_t kBlock = 64;
  GNNIO_CHECK(A >= 1 && A <= kMaxAtt, ErrorKind::kInvalidArgument,
              "head_scores backward: 1 to 4 attention vectors, got ", A);
#pragma omp parallel for schedule(static) if (worth_threads(p.num_rows * HC * A))
  for (int64_t k = 0; k < chunks; ++k) {
    const int64_t begin = k * kHeadScoreChunkRows;
    const int64_t end = begin + kHeadScoreChunkRows < p.num_rows ? begin + kHeadScoreChunkRows
                                                                 : p.num_rows;
    scalar_t* part = partials ? partials + k * A * HC : nullptr;
    if (part)
      for (int64_t i = 0; i < A * HC; ++i) part[i] = 0;
    // Per (row, head): the channel loops are innermost, unit-stride and free of index
    // arithmetic, so they vectorise (with a division and the vectors' loop per element this
    // took 1.26 ms single-threaded on Cora's GAT shapes, 0.56 now: bench/NOTES.md "CPU path").
    // Each sum keeps its order: d x over a from 0, the partials over the chunk's rows in order.
    for (int64_t n = begin; n < end; ++n) {
      for (int64_t h = 0; h < H; ++h) {
        const scalar_t* xr = x + (n * H + h) * C;
        scalar_t g_a[kMaxAtt];
        for (int64_t a = 0; a < A; ++a) g_a[a] = g[a * NH + n * H + h];
        if (grad_x) {
          scalar_t* gx = grad_x + (n * H + h) * C;
          // Blocks of channels with the vectors' loop outside the channels' (vectorised).
          for (int64_t c0 = 0; c0 < C; c0 += kBlock) {
            const int64_t width = C - c0 < kBlock ? C - c0 : kBlock;
            scalar_t acc[kBlock];
            for (int64_t c = 0; c < width; ++c) acc[c] = 0;
            for (int64_t a = 0; a < A; ++a) {
              const scalar_t* ar = att + a * HC + h * C + c0;
              for (int64_t c = 0; c < width; ++c) acc[c] += g_a[a] * ar[c];
            }
            if (p.grad_x_accumulate)
              for (int64_t c = 0; c < width; ++c) gx[c0 + c] += acc[c];
            else
              for (int64_t c = 0; c < width; ++c) gx[c0 + c] = acc[c];
          }
        }
        if (part)
          for (int64_t a = 0; a < A; ++a) {
            scalar_t* pa = part + a * HC + h * C;
            for (int64_t c = 0; c < C; ++c) pa[c] += g_a[a] * xr[c];
          }
      }
    }
  }
}

}  // namespace

// No index type here: dispatch_cpu's is a placeholder.
void head_scores_cpu(const HeadScoresParams& p) {
  dispatch_cpu(p.scalar_type, IndexType::kInt32, "head_scores",
               [&](auto s, auto) { forward<decltype(s)>(p); });
}

void head_scores_backward_cpu(const HeadScoresBackwardParams& p) {
  dispatch_cpu(p.scalar_type, IndexType::kInt32, "head_scores backward",
               [&](auto s, auto) { backward<decltype(s)>(p); });
}

}  // namespace gnnio
