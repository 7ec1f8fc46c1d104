// The CPU core of the fused reassociated TransformerConv attention (gnnio/transformer/params.h)
// against the direct form written here in long double: keys and values projected per source,
// scores q_i . k_j / sqrt(C) per head, PyG's softmax, out = sum_j alpha v_j + residual. float64
// operands, so the reassociation's only difference is rounding (and b_v on a row with edges,
// where the direct form has b_v sum_j alpha = b_v s / (s + 1e-16)). Random graphs with an
// isolated destination, a duplicate edge, a row longer than two chunks, and bipartite sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "gnnio/transformer/params.h"

namespace {

struct Shape {
  int64_t num_src, num_dst, heads, channels, features;
};

// A random problem of one shape: an isolated destination (row 0), a row longer than two chunks
// (row 1), rows of 0-6 edges with a duplicate edge each, float64 operands.
struct Problem {
  int64_t ns, nd, H, C, F, HC;
  std::vector<int64_t> rowptr{0}, col;
  std::vector<double> x, q, wk, wv, wvt, bv, res;

  explicit Problem(const Shape& shape)
      : ns(shape.num_src), nd(shape.num_dst), H(shape.heads), C(shape.channels), F(shape.features),
        HC(H * C) {
    std::mt19937_64 rng(std::random_device{}());
    std::normal_distribution<double> normal;
    std::uniform_int_distribution<int64_t> pick(0, ns - 1);
    for (int64_t i = 0; i < nd; ++i) {
      const int64_t deg = i == 0 ? 0 : i == 1 ? 3 * gnnio::kTransformerChunk + 5 : i % 7;
      for (int64_t k = 0; k < deg; ++k) col.push_back(pick(rng));
      if (deg > 1) col.back() = col[col.size() - 2];  // a duplicate edge
      rowptr.push_back(static_cast<int64_t>(col.size()));
    }
    auto draw = [&](int64_t n) {
      std::vector<double> v(n);
      for (auto& e : v) e = normal(rng);
      return v;
    };
    x = draw(ns * F), q = draw(nd * HC), wk = draw(HC * F), wv = draw(HC * F), bv = draw(HC),
    res = draw(nd * HC);
    wvt.resize(F * HC);
    for (int64_t o = 0; o < HC; ++o)
      for (int64_t f = 0; f < F; ++f) wvt[f * HC + o] = wv[o * F + f];
  }

  gnnio::TransformerFusedParams params(double* out, double* stats) const {
    gnnio::TransformerFusedParams p;
    p.rowptr = rowptr.data();
    p.col = col.data();
    p.scalar_type = gnnio::ScalarType::kFloat64;
    p.num_dst = nd;
    p.num_src = ns;
    p.heads = H;
    p.channels = C;
    p.features = F;
    p.x = x.data();
    p.query = q.data();
    p.w_key = wk.data();
    p.w_value_t = wvt.data();
    p.b_value = bv.data();
    p.residual = res.data();
    p.scale = 1.0 / std::sqrt(double(C));
    p.out = out;
    p.stats = stats;
    return p;
  }
};

class TransformerFusedCpu : public ::testing::TestWithParam<Shape> {};

TEST_P(TransformerFusedCpu, Float64MatchesTheDirectFormInLongDouble) {
  const Problem pr(GetParam());
  const auto& [ns, nd, H, C, F, HC, rowptr, col, x, q, wk, wv, wvt, bv, res] = pr;
  std::vector<double> out(nd * HC, -1), stats(nd * H * 2, -1);
  const gnnio::TransformerFusedParams p = pr.params(out.data(), stats.data());
  gnnio::transformer_fused_forward_cpu(p);

  auto project = [&](const std::vector<double>& w, int64_t j, int64_t o) {
    long double a = 0;
    for (int64_t f = 0; f < F; ++f) a += (long double)w[o * F + f] * x[j * F + f];
    return a;
  };
  for (int64_t i = 0; i < nd; ++i) {
    for (int64_t h = 0; h < H; ++h) {
      std::vector<long double> e;
      long double m = -INFINITY, s = 0;
      for (int64_t k = rowptr[i]; k < rowptr[i + 1]; ++k) {
        long double d = 0;
        for (int64_t c = 0; c < C; ++c) d += (long double)q[i * HC + h * C + c] * project(wk, col[k], h * C + c);
        e.push_back(d * (long double)p.scale);
        m = std::max(m, e.back());
      }
      for (auto v : e) s += std::exp(v - m);
      const long double denom = s + 1e-16L;
      double scale_mag = 0;
      for (int64_t c = 0; c < C; ++c) {
        const int64_t o = h * C + c;
        long double v = 0, mag = std::fabs(res[i * HC + o]);
        for (int64_t k = rowptr[i], n = 0; k < rowptr[i + 1]; ++k, ++n) {
          const long double pv = project(wv, col[k], o);
          v += std::exp(e[n] - m) / denom * pv;
          mag += std::fabs(pv);
        }
        if (!e.empty()) v += bv[o], mag += std::fabs(bv[o]);
        v += res[i * HC + o];
        scale_mag = std::max(scale_mag, double(mag));
        // The two orders' float64 rounding is ~1e-14 of these magnitudes (sums of ~F C terms,
        // scores of |e| < 50 whose error moves a weight by e 2^-52); 1e-9 leaves room for that
        // and still fails any algorithmic slip (a dropped chunk rescale or edge is O(1)).
        EXPECT_NEAR(out[i * HC + o], double(v), 1e-9 * (1 + double(mag))) << "row " << i << " out " << o;
      }
      if (!e.empty()) {
        EXPECT_NEAR(stats[(i * H + h) * 2], double(m), 1e-10 * (1 + std::fabs(double(m))));
        EXPECT_NEAR(stats[(i * H + h) * 2 + 1], double(denom), 1e-10 * double(denom));
      } else {
        EXPECT_EQ(stats[(i * H + h) * 2], 0.0);
        EXPECT_EQ(stats[(i * H + h) * 2 + 1], 1e-16);
      }
    }
  }
}

// Out written into the residual (the inference op's params: out == residual, no stats): the
// separate out's values, bit for bit, rows without edges included.
TEST_P(TransformerFusedCpu, OutInTheResidualWithoutStatsHasTheSameBits) {
  Problem pr(GetParam());
  std::vector<double> out(pr.nd * pr.HC, -1), stats(pr.nd * pr.H * 2, -1);
  gnnio::transformer_fused_forward_cpu(pr.params(out.data(), stats.data()));
  gnnio::TransformerFusedParams p = pr.params(pr.res.data(), nullptr);
  gnnio::transformer_fused_forward_cpu(p);
  for (int64_t k = 0; k < pr.nd * pr.HC; ++k) EXPECT_EQ(pr.res[k], out[k]) << "element " << k;
}

INSTANTIATE_TEST_SUITE_P(Shapes, TransformerFusedCpu,
                         ::testing::Values(Shape{20, 12, 4, 8, 16}, Shape{9, 30, 2, 5, 13},
                                           Shape{40, 6, 1, 16, 7}, Shape{15, 15, 3, 4, 128}));

}  // namespace
