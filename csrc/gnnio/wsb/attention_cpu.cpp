// GAT attention on WSB tiles, CPU: the CUDA kernels' two-pass algorithm (attention.h), one
// OpenMP task per block row (forward, pass A) or source block (pass B), so every output has one
// owner and the sums are in a fixed order.
#include <algorithm>
#include <cmath>
#include <limits>

#include "gnnio/common/cpu_dispatch.h"
#include "gnnio/wsb/attention.h"

namespace gnnio {
namespace {

constexpr double kSoftmaxEps = 1e-16;  // PyG's softmax denominator guard

inline int64_t rows_in_block(int64_t b, int64_t n) {
  return std::min<int64_t>(kWsbTile, n - b * kWsbTile);
}

template <typename scalar_t>
struct Scores {
  const scalar_t* src;
  const scalar_t* dst;  // nullptr: no destination score
  int64_t heads;
  scalar_t slope;
  scalar_t z(int64_t i, int64_t j, int64_t h) const {
    return dst ? src[j * heads + h] + dst[i * heads + h] : src[j * heads + h];
  }
  scalar_t leaky(scalar_t z) const { return z > 0 ? z : z * slope; }
  scalar_t leaky_grad(scalar_t z) const { return z > 0 ? scalar_t(1) : slope; }
};

template <typename scalar_t, typename index_t>
void forward(const WsbAttentionParams& p) {
  const auto* block_rowptr = static_cast<const index_t*>(p.block_rowptr);
  const auto* block_col = static_cast<const index_t*>(p.block_col);
  const auto* value = static_cast<const scalar_t*>(p.value);
  auto* out = static_cast<scalar_t*>(p.out);
  auto* stats = static_cast<scalar_t*>(p.stats);
  const int64_t H = p.heads, C = p.channels;
  const Scores<scalar_t> sc{static_cast<const scalar_t*>(p.src_score),
                            static_cast<const scalar_t*>(p.dst_score), H,
                            static_cast<scalar_t>(p.negative_slope)};

#pragma omp parallel for schedule(dynamic, 16) if (worth_threads(p.num_tiles * kWsbTileSize * H * C))
  for (int64_t b = 0; b < wsb_blocks(p.num_dst); ++b) {
    const int64_t rows = rows_in_block(b, p.num_dst);
    scalar_t m[kWsbTile], s[kWsbTile];
    for (int64_t h = 0; h < H; ++h) {
      // Pass 1: the row maxima and sums from the scores alone.
      std::fill(m, m + kWsbTile, -std::numeric_limits<scalar_t>::infinity());
      std::fill(s, s + kWsbTile, scalar_t(0));
      for (int64_t t = block_rowptr[b]; t < block_rowptr[b + 1]; ++t) {
        const int64_t c0 = int64_t(block_col[t]) * kWsbTile;
        const float* cnt = p.count + t * kWsbTileSize;
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t c = 0; c < kWsbTile; ++c) {
            const float n = cnt[r * kWsbTile + c];
            if (n == 0) continue;
            const scalar_t e = sc.leaky(sc.z(b * kWsbTile + r, c0 + c, h));
            if (e > m[r]) {  // a new maximum: rescale the sum so far (0 at first)
              s[r] = m[r] == -std::numeric_limits<scalar_t>::infinity() ? scalar_t(0)
                                                                         : s[r] * std::exp(m[r] - e);
              m[r] = e;
            }
            s[r] += scalar_t(n) * std::exp(e - m[r]);
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        if (m[r] == -std::numeric_limits<scalar_t>::infinity()) m[r] = 0;  // no edge (or all -inf)
        s[r] += scalar_t(kSoftmaxEps);
        scalar_t* st = stats + ((b * kWsbTile + r) * H + h) * 2;
        st[0] = m[r];
        st[1] = s[r];
        scalar_t* o = out + ((b * kWsbTile + r) * H + h) * C;
        std::fill(o, o + C, scalar_t(0));
      }
      // Pass 2: out += P · value, P final.
      for (int64_t t = block_rowptr[b]; t < block_rowptr[b + 1]; ++t) {
        const int64_t c0 = int64_t(block_col[t]) * kWsbTile;
        const float* cnt = p.count + t * kWsbTileSize;
        for (int64_t r = 0; r < rows; ++r) {
          scalar_t* o = out + ((b * kWsbTile + r) * H + h) * C;
          for (int64_t c = 0; c < kWsbTile; ++c) {
            const float n = cnt[r * kWsbTile + c];
            if (n == 0) continue;
            const int64_t j = c0 + c;
            const scalar_t w =
                scalar_t(n) * std::exp(sc.leaky(sc.z(b * kWsbTile + r, j, h)) - m[r]) / s[r];
            const scalar_t* v = value + (j * H + h) * C;
            for (int64_t f = 0; f < C; ++f) o[f] += w * v[f];
          }
        }
      }
    }
  }
}

template <typename scalar_t, typename index_t>
void backward(const WsbAttentionBackwardParams& b) {
  const WsbAttentionParams& p = b.fwd;
  const int64_t H = p.heads, C = p.channels;
  const auto* value = static_cast<const scalar_t*>(p.value);
  const auto* out = static_cast<const scalar_t*>(p.out);
  const auto* stats = static_cast<const scalar_t*>(p.stats);
  const auto* dout = static_cast<const scalar_t*>(b.grad_out);
  auto* delta = static_cast<scalar_t*>(b.delta);
  const Scores<scalar_t> sc{static_cast<const scalar_t*>(p.src_score),
                            static_cast<const scalar_t*>(p.dst_score), H,
                            static_cast<scalar_t>(p.negative_slope)};
  const int64_t work = p.num_tiles * kWsbTileSize * H * C;

  // D_i = dout_i . out_i. Pass A forms it as sum_j P_ij dP_ij (the same number: out_i is
  // sum_j P_ij v_j) from the products it makes anyway, as the CUDA pass A does; this loop only
  // where pass A does not run.
  if (!b.grad_dst_score) {
#pragma omp parallel for if (worth_threads(p.num_dst * H * C))
    for (int64_t ih = 0; ih < p.num_dst * H; ++ih) {
      scalar_t d = 0;
      for (int64_t f = 0; f < C; ++f) d += dout[ih * C + f] * out[ih * C + f];
      delta[ih] = d;
    }
  }
  // P_ij, dP_ij = dout_i . v_j and LeakyReLU's slope at z_ij of one entry, as both passes form them.
  auto terms = [&](int64_t i, int64_t j, int64_t h, float n, scalar_t* w, scalar_t* dp, scalar_t* lk) {
    const scalar_t z = sc.z(i, j, h);
    const scalar_t* st = stats + (i * H + h) * 2;
    *w = scalar_t(n) * std::exp(sc.leaky(z) - st[0]) / st[1];
    const scalar_t* o = dout + (i * H + h) * C;
    const scalar_t* v = value + (j * H + h) * C;
    scalar_t d = 0;
    for (int64_t f = 0; f < C; ++f) d += o[f] * v[f];
    *dp = d;
    *lk = sc.leaky_grad(z);
  };
  // P_ij and dZ_ij = P_ij (dP_ij - D_i) lk_ij (pass B).
  auto entry = [&](int64_t i, int64_t j, int64_t h, float n, scalar_t* p_out) {
    scalar_t dp, lk;
    terms(i, j, h, n, p_out, &dp, &lk);
    return *p_out * (dp - delta[i * H + h]) * lk;
  };

  if (b.grad_dst_score) {  // pass A: by destination block
    auto* gd = static_cast<scalar_t*>(b.grad_dst_score);
    const auto* block_rowptr = static_cast<const index_t*>(p.block_rowptr);
    const auto* block_col = static_cast<const index_t*>(p.block_col);
#pragma omp parallel for schedule(dynamic, 16) if (worth_threads(work))
    for (int64_t db = 0; db < wsb_blocks(p.num_dst); ++db) {
      const int64_t rows = rows_in_block(db, p.num_dst);
      for (int64_t h = 0; h < H; ++h) {
        // sum_j P dP lk - D_i sum_j P lk, with D_i = sum_j P dP: three sums a row.
        scalar_t g_dp[kWsbTile] = {}, g_p[kWsbTile] = {}, d_sum[kWsbTile] = {};
        for (int64_t t = block_rowptr[db]; t < block_rowptr[db + 1]; ++t) {
          const int64_t c0 = int64_t(block_col[t]) * kWsbTile;
          const float* cnt = p.count + t * kWsbTileSize;
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < kWsbTile; ++c) {
              const float n = cnt[r * kWsbTile + c];
              if (n == 0) continue;
              scalar_t w, dp, lk;
              terms(db * kWsbTile + r, c0 + c, h, n, &w, &dp, &lk);
              const scalar_t wdp = w * dp;
              d_sum[r] += wdp;
              g_dp[r] += wdp * lk;
              g_p[r] += w * lk;
            }
        }
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t ih = (db * kWsbTile + r) * H + h;
          delta[ih] = d_sum[r];
          gd[ih] = g_dp[r] - d_sum[r] * g_p[r];
        }
      }
    }
  }
  if (b.grad_src_score || b.grad_value) {  // pass B: by source block, over the transposed tiles
    auto* gs = static_cast<scalar_t*>(b.grad_src_score);
    auto* gv = static_cast<scalar_t*>(b.grad_value);
    const auto* block_rowptr = static_cast<const index_t*>(b.block_rowptr_t);
    const auto* block_col = static_cast<const index_t*>(b.block_col_t);
#pragma omp parallel for schedule(dynamic, 16) if (worth_threads(work))
    for (int64_t sb = 0; sb < wsb_blocks(p.num_src); ++sb) {
      const int64_t rows = rows_in_block(sb, p.num_src);
      for (int64_t h = 0; h < H; ++h) {
        scalar_t acc[kWsbTile] = {};
        if (gv)
          for (int64_t r = 0; r < rows; ++r) {
            scalar_t* g = gv + ((sb * kWsbTile + r) * H + h) * C;
            std::fill(g, g + C, scalar_t(0));
          }
        for (int64_t t = block_rowptr[sb]; t < block_rowptr[sb + 1]; ++t) {
          const int64_t d0 = int64_t(block_col[t]) * kWsbTile;
          const float* cnt = b.count_t + t * kWsbTileSize;
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t c = 0; c < kWsbTile; ++c) {
              const float n = cnt[r * kWsbTile + c];
              if (n == 0) continue;
              const int64_t i = d0 + c, j = sb * kWsbTile + r;
              scalar_t w;
              acc[r] += entry(i, j, h, n, &w);
              if (gv) {
                scalar_t* g = gv + (j * H + h) * C;
                const scalar_t* o = dout + (i * H + h) * C;
                for (int64_t f = 0; f < C; ++f) g[f] += w * o[f];
              }
            }
        }
        if (gs)
          for (int64_t r = 0; r < rows; ++r) gs[(sb * kWsbTile + r) * H + h] = acc[r];
      }
    }
  }
}

}  // namespace

void wsb_attention_forward_cpu(const WsbAttentionParams& p) {
  dispatch_cpu(p.scalar_type, p.index_type, "wsb_attention", [&](auto scalar, auto index) {
    forward<decltype(scalar), decltype(index)>(p);
  });
}

void wsb_attention_backward_cpu(const WsbAttentionBackwardParams& b) {
  dispatch_cpu(b.fwd.scalar_type, b.fwd.index_type, "wsb_attention", [&](auto scalar, auto index) {
    backward<decltype(scalar), decltype(index)>(b);
  });
}

}  // namespace gnnio
