// CPU kernel of TransformerConv's fused reassociated attention: params.h's algorithm in its
// order of sums (chunks of kTransformerChunk slots, quarter sums of each score, the running sum
// per chunk position), for any F, H and C, in the operands' type (float32 or float64). It is what
// CI runs of the fused form; the CUDA kernel adds the heavy rows' items and their merge.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "gnnio/common/cpu_dispatch.h"
#include "gnnio/transformer/params.h"

namespace gnnio {
namespace {

constexpr double kSoftmaxEps = 1e-16;

template <typename scalar_t, typename index_t>
void forward(const TransformerFusedParams& p) {
  const auto* rowptr = static_cast<const index_t*>(p.rowptr);
  const auto* col = static_cast<const index_t*>(p.col);
  const auto* x = static_cast<const scalar_t*>(p.x);
  const auto* query = static_cast<const scalar_t*>(p.query);
  const auto* w_key = static_cast<const scalar_t*>(p.w_key);
  const auto* w_value_t = static_cast<const scalar_t*>(p.w_value_t);
  const auto* b_value = static_cast<const scalar_t*>(p.b_value);
  const auto* residual = static_cast<const scalar_t*>(p.residual);
  const auto* b_key = static_cast<const scalar_t*>(p.b_key);
  auto* out = static_cast<scalar_t*>(p.out);
  auto* stats = static_cast<scalar_t*>(p.stats);
  const int64_t H = p.heads, C = p.channels, F = p.features, HC = H * C;
  const scalar_t scale = static_cast<scalar_t>(p.scale);
  constexpr int kChunk = kTransformerChunk;
  const scalar_t eps = static_cast<scalar_t>(kSoftmaxEps);

#pragma omp parallel if (worth_threads(p.num_dst * HC * F))
  {
    std::vector<scalar_t> qt(H * F), acc(H * F), xt(H * F);
    std::vector<scalar_t> m(H), run(H * kChunk), e(H * kChunk), w(H * kChunk), r(H);
#pragma omp for schedule(dynamic, 64)
    for (int64_t i = 0; i < p.num_dst; ++i) {
      const scalar_t* q = query + i * HC;
      for (int64_t h = 0; h < H; ++h)
        for (int64_t f = 0; f < F; ++f) {
          scalar_t a = 0;
          for (int64_t c = 0; c < C; ++c) a += q[h * C + c] * w_key[(h * C + c) * F + f];
          qt[h * F + f] = a;
        }
      std::fill(acc.begin(), acc.end(), scalar_t(0));
      std::fill(run.begin(), run.end(), scalar_t(0));
      std::fill(m.begin(), m.end(), -std::numeric_limits<scalar_t>::infinity());
      const int64_t begin = rowptr[i], end = rowptr[i + 1];
      for (int64_t base = begin; base < end; base += kChunk) {
        const int n = static_cast<int>(std::min<int64_t>(kChunk, end - base));
        for (int64_t h = 0; h < H; ++h) {
          scalar_t mx = -std::numeric_limits<scalar_t>::infinity();
          for (int j = 0; j < n; ++j) {
            const scalar_t* xj = x + static_cast<int64_t>(col[base + j]) * F;
            scalar_t part[4] = {0, 0, 0, 0};  // quarter g: the features f with (f / 4) % 4 == g
            for (int64_t f = 0; f < F; ++f) part[(f / 4) % 4] += qt[h * F + f] * xj[f];
            e[h * kChunk + j] = ((part[0] + part[1]) + (part[2] + part[3])) * scale;
            mx = std::max(mx, e[h * kChunk + j]);
          }
          const scalar_t m_new = std::max(m[h], mx);
          r[h] = std::exp(m[h] - m_new);
          for (int j = 0; j < kChunk; ++j) {
            w[h * kChunk + j] = j < n ? std::exp(e[h * kChunk + j] - m_new) : scalar_t(0);
            run[h * kChunk + j] = run[h * kChunk + j] * r[h] + w[h * kChunk + j];
          }
          m[h] = m_new;
        }
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t f = 0; f < F; ++f) acc[h * F + f] *= r[h];
          for (int j = 0; j < n; ++j) {
            const scalar_t* xj = x + static_cast<int64_t>(col[base + j]) * F;
            const scalar_t wj = w[h * kChunk + j];
            for (int64_t f = 0; f < F; ++f) acc[h * F + f] += wj * xj[f];
          }
        }
      }
      for (int64_t h = 0; h < H; ++h) {
        const scalar_t* s = &run[h * kChunk];
        const scalar_t sum = (((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]))) + eps;
        for (int64_t f = 0; f < F; ++f) xt[h * F + f] = acc[h * F + f] / sum;
        if (!stats) continue;  // (transformer_fused_inference: nothing reads them)
        scalar_t shift = 0;  // the key bias's shift of the direct scores: q_h . b_k,h
        if (b_key)
          for (int64_t c = 0; c < C; ++c) shift += q[h * C + c] * b_key[h * C + c];
        stats[(i * H + h) * 2] = (end > begin ? m[h] : scalar_t(0)) + scale * shift;
        stats[(i * H + h) * 2 + 1] = sum;
      }
      for (int64_t o = 0; o < HC; ++o) {
        const int64_t h = o / C;
        scalar_t v = 0;
        for (int64_t f = 0; f < F; ++f) v += xt[h * F + f] * w_value_t[f * HC + o];
        if (b_value && end > begin) v += b_value[o];
        if (residual) v = residual[i * HC + o] + v;  // (out may be residual: read, then written)
        out[i * HC + o] = v;
      }
    }
  }
}

}  // namespace

void transformer_fused_forward_cpu(const TransformerFusedParams& p) {
  static_assert(kTransformerChunk == 8, "the running sums' tree is written for 8 positions");
  dispatch_cpu(p.scalar_type, p.index_type, "transformer_fused_forward", [&](auto scalar, auto index) {
    forward<decltype(scalar), decltype(index)>(p);
  });
}

}  // namespace gnnio
