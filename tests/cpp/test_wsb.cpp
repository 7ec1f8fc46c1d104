#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "gnnio/common/error.h"
#include "gnnio/wsb/attention.h"
#include "gnnio/wsb/params.h"

namespace {

using gnnio::kWsbTile;
using gnnio::kWsbTileSize;

struct Coo {
  int64_t num_rows, num_cols;
  std::vector<int64_t> row, col;
};

template <typename index_t>
struct Wsb {
  std::vector<index_t> block_rowptr, block_col;
  std::vector<int64_t> pos;
};

template <typename index_t>
Wsb<index_t> build(const Coo& g) {
  const std::vector<index_t> row(g.row.begin(), g.row.end()), col(g.col.begin(), g.col.end());
  Wsb<index_t> w;
  w.block_rowptr.assign(gnnio::wsb_blocks(g.num_rows) + 1, -1);
  w.pos.assign(row.size(), -1);
  gnnio::WsbBuildParams p;
  p.row = row.data();
  p.col = col.data();
  p.num_edges = static_cast<int64_t>(row.size());
  p.num_rows = g.num_rows;
  p.num_cols = g.num_cols;
  p.index_type = sizeof(index_t) == 4 ? gnnio::IndexType::kInt32 : gnnio::IndexType::kInt64;
  p.block_rowptr = w.block_rowptr.data();
  p.pos = w.pos.data();
  w.block_col.assign(gnnio::wsb_count_tiles_cpu(p), -1);
  p.block_col = w.block_col.data();
  gnnio::wsb_fill_cpu(p);
  return w;
}

Coo random_coo(std::mt19937_64& rng, int64_t rows, int64_t cols, int64_t edges) {
  Coo g{rows, cols, std::vector<int64_t>(edges), std::vector<int64_t>(edges)};
  for (auto& r : g.row) r = rng() % rows;
  for (auto& c : g.col) c = rng() % cols;
  return g;
}

// The adversarial shapes: sizes not multiples of 16, bipartite both ways, duplicates, empty
// block rows (rows 16..47 receive nothing), no edges, no nodes.
std::vector<std::pair<const char*, Coo>> cases(std::mt19937_64& rng) {
  std::vector<std::pair<const char*, Coo>> out;
  out.push_back({"random 37x53", random_coo(rng, 37, 53, 600)});
  out.push_back({"bipartite 5x100", random_coo(rng, 5, 100, 300)});
  out.push_back({"bipartite 100x5", random_coo(rng, 100, 5, 300)});
  out.push_back({"duplicates", Coo{3, 3, {0, 0, 0, 1, 2, 2}, {1, 1, 1, 2, 0, 0}}});
  Coo gaps{70, 70, {}, {}};
  for (int64_t i = 0; i < 200; ++i) {
    const int64_t r = rng() % 38;
    gaps.row.push_back(r < 16 ? r : r + 32);
    gaps.col.push_back(rng() % 70);
  }
  out.push_back({"empty block rows", gaps});
  out.push_back({"no edges", Coo{20, 20, {}, {}}});
  out.push_back({"no nodes", Coo{0, 0, {}, {}}});
  out.push_back({"dense 32x32", Coo{32, 32, {}, {}}});
  for (int64_t r = 0; r < 32; ++r)
    for (int64_t c = 0; c < 32; ++c) {
      out.back().second.row.push_back(r);
      out.back().second.col.push_back(c);
    }
  return out;
}

template <typename index_t>
void expect_valid(const Coo& g, const Wsb<index_t>& w, const char* name) {
  const int64_t block_rows = gnnio::wsb_blocks(g.num_rows);
  ASSERT_EQ(static_cast<int64_t>(w.block_rowptr.size()), block_rows + 1) << name;
  EXPECT_EQ(w.block_rowptr[0], 0) << name;
  std::set<std::pair<int64_t, int64_t>> tiles;  // brute force: distinct (block row, block column)
  for (size_t e = 0; e < g.row.size(); ++e) tiles.insert({g.row[e] / kWsbTile, g.col[e] / kWsbTile});
  ASSERT_EQ(w.block_col.size(), tiles.size()) << name;
  EXPECT_EQ(static_cast<size_t>(w.block_rowptr[block_rows]), tiles.size()) << name;
  auto it = tiles.begin();  // tiles are stored in (block row, block column) order
  for (int64_t b = 0; b < block_rows; ++b)
    for (int64_t t = w.block_rowptr[b]; t < w.block_rowptr[b + 1]; ++t, ++it)
      EXPECT_EQ(std::make_pair(b, int64_t(w.block_col[t])), *it) << name << " tile " << t;
  for (size_t e = 0; e < g.row.size(); ++e) {
    const int64_t r = g.row[e], c = g.col[e], tile = w.pos[e] / kWsbTileSize;
    EXPECT_GE(tile, w.block_rowptr[r / kWsbTile]) << name << " edge " << e;
    EXPECT_LT(tile, w.block_rowptr[r / kWsbTile + 1]) << name << " edge " << e;
    EXPECT_EQ(w.block_col[tile], c / kWsbTile) << name << " edge " << e;
    EXPECT_EQ(w.pos[e] % kWsbTileSize, (r % kWsbTile) * kWsbTile + c % kWsbTile) << name;
  }
}

TEST(WsbBuildCpu, MatchesBruteForceOnAdversarialShapes) {
  std::mt19937_64 rng(std::random_device{}());
  for (const auto& [name, g] : cases(rng)) {
    expect_valid(g, build<int64_t>(g), name);
    const auto w32 = build<int32_t>(g);
    expect_valid(g, w32, name);
    EXPECT_EQ(w32.pos, build<int64_t>(g).pos) << name;  // both index types give one layout
  }
}

TEST(WsbBuildCpu, OutOfRangeIdsRaiseIndexErrors) {
  for (const Coo& g : {Coo{20, 20, {3, 20}, {1, 2}}, Coo{20, 20, {3, 4}, {1, -1}}}) {
    try {
      build<int64_t>(g);
      FAIL() << "no error";
    } catch (const gnnio::Error& e) {
      EXPECT_EQ(e.kind(), gnnio::ErrorKind::kIndex);
    }
  }
}

// Tile values from per-edge weights (duplicates summed), as gnnio.Graph packs them.
template <typename T>
std::vector<T> pack(const Wsb<int64_t>& w, const std::vector<double>& weight) {
  std::vector<double> acc(w.block_col.size() * kWsbTileSize, 0.0);
  for (size_t e = 0; e < weight.size(); ++e) acc[w.pos[e]] += weight[e];
  return std::vector<T>(acc.begin(), acc.end());
}

template <typename T>
void check_spmm(const Coo& g, int64_t width, const char* name, std::mt19937_64& rng, double tol) {
  std::normal_distribution<double> normal;
  const auto w = build<int64_t>(g);
  std::vector<double> weight(g.row.size());
  for (auto& v : weight) v = normal(rng);
  const std::vector<T> values = pack<T>(w, weight);
  const int64_t x_stride = width + 2, out_stride = width + 1;  // rows apart by more than width
  std::vector<T> x(g.num_cols * x_stride), out(g.num_rows * out_stride, T(-7));
  for (auto& v : x) v = static_cast<T>(normal(rng));
  gnnio::WsbSpmmParams p;
  p.block_rowptr = w.block_rowptr.data();
  p.block_col = w.block_col.data();
  p.values = values.data();
  p.x = x.data();
  p.out = out.data();
  p.scalar_type = sizeof(T) == 4 ? gnnio::ScalarType::kFloat32 : gnnio::ScalarType::kFloat64;
  p.num_rows = g.num_rows;
  p.num_cols = g.num_cols;
  p.num_tiles = static_cast<int64_t>(w.block_col.size());
  p.width = width;
  p.x_row_stride = x_stride;
  p.out_row_stride = out_stride;
  gnnio::wsb_spmm_cpu(p);
  // Dense float64 reference over the edges, and the mass sum |w x| each output sums.
  std::vector<double> ref(g.num_rows * width, 0.0), mass(g.num_rows * width, 0.0);
  for (size_t e = 0; e < g.row.size(); ++e)
    for (int64_t f = 0; f < width; ++f) {
      const double term = weight[e] * double(x[g.col[e] * x_stride + f]);
      ref[g.row[e] * width + f] += term;
      mass[g.row[e] * width + f] += std::abs(term);
    }
  for (int64_t r = 0; r < g.num_rows; ++r) {
    for (int64_t f = 0; f < width; ++f)
      ASSERT_NEAR(out[r * out_stride + f], ref[r * width + f], tol * (mass[r * width + f] + 1e-30))
          << name << " width " << width << " row " << r << " feature " << f;
    if (width < out_stride) EXPECT_EQ(out[r * out_stride + width], T(-7)) << "wrote past the row";
  }
}

TEST(WsbSpmmCpu, MatchesDenseFloat64Reference) {
  std::mt19937_64 rng(std::random_device{}());
  for (const auto& [name, g] : cases(rng))
    for (int64_t width : {1, 3, 33, 130}) {
      // float32: values rounded once, then <= 16 * tiles-per-row float32 additions of terms
      // bounded by the mass; 1e-5 of the mass is far above that and far below a wrong entry.
      check_spmm<float>(g, width, name, rng, 1e-5);
      check_spmm<double>(g, width, name, rng, 1e-13);
    }
}

TEST(WsbSddmmCpu, MatchesDotProductsAndZeroPadding) {
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal;
  const Coo g = random_coo(rng, 37, 21, 300);
  const auto w = build<int64_t>(g);
  const int64_t width = 5, tiles = static_cast<int64_t>(w.block_col.size());
  std::vector<double> a(g.num_rows * width), b(g.num_cols * width), out(tiles * kWsbTileSize, 99);
  for (auto& v : a) v = normal(rng);
  for (auto& v : b) v = normal(rng);
  gnnio::WsbSddmmParams p;
  p.block_rowptr = w.block_rowptr.data();
  p.block_col = w.block_col.data();
  p.a = a.data();
  p.b = b.data();
  p.out = out.data();
  p.scalar_type = gnnio::ScalarType::kFloat64;
  p.num_rows = g.num_rows;
  p.num_cols = g.num_cols;
  p.num_tiles = tiles;
  p.width = width;
  p.a_row_stride = p.b_row_stride = width;
  gnnio::wsb_sddmm_cpu(p);
  for (int64_t blk = 0; blk < gnnio::wsb_blocks(g.num_rows); ++blk)
    for (int64_t t = w.block_rowptr[blk]; t < w.block_rowptr[blk + 1]; ++t)
      for (int64_t r = 0; r < kWsbTile; ++r)
        for (int64_t c = 0; c < kWsbTile; ++c) {
          const int64_t row = blk * kWsbTile + r, col = w.block_col[t] * kWsbTile + c;
          double ref = 0;
          if (row < g.num_rows && col < g.num_cols)
            for (int64_t f = 0; f < width; ++f) ref += a[row * width + f] * b[col * width + f];
          ASSERT_NEAR(out[t * kWsbTileSize + r * kWsbTile + c], ref, 1e-12) << "tile " << t;
        }
}

}  // namespace

// GAT attention on tiles (float64) against the softmax written out edge by edge: out, stats and
// the three gradients, on every adversarial shape (duplicates are separate softmax terms, so the
// count tiles carry them).
TEST(WsbAttentionCpu, MatchesEdgeByEdgeFloat64) {
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal;
  const int64_t H = 2, C = 3;
  const double slope = 0.2;
  for (const auto& [name, g] : cases(rng)) {
    const int64_t nd = g.num_rows, ns = g.num_cols, E = static_cast<int64_t>(g.row.size());
    const auto w = build<int64_t>(g);
    const auto wt = build<int64_t>(Coo{ns, nd, g.col, g.row});
    std::vector<float> count(w.block_col.size() * kWsbTileSize, 0.f), count_t(wt.block_col.size() * kWsbTileSize, 0.f);
    for (int64_t e = 0; e < E; ++e) {
      count[w.pos[e]] += 1.f;
      count_t[wt.pos[e]] += 1.f;
    }
    std::vector<double> src(ns * H), dst(nd * H), value(ns * H * C), dout(nd * H * C);
    for (auto* v : {&src, &dst, &value, &dout})
      for (auto& x : *v) x = normal(rng);
    std::vector<double> out(nd * H * C, 7), stats(nd * H * 2, 7), delta(nd * H), gs(ns * H, 7),
        gd(nd * H, 7), gv(ns * H * C, 7);
    gnnio::WsbAttentionBackwardParams b;
    gnnio::WsbAttentionParams& p = b.fwd;
    p.block_rowptr = w.block_rowptr.data();
    p.block_col = w.block_col.data();
    p.count = count.data();
    p.num_tiles = static_cast<int64_t>(w.block_col.size());
    p.scalar_type = gnnio::ScalarType::kFloat64;
    p.num_dst = nd;
    p.num_src = ns;
    p.heads = H;
    p.channels = C;
    p.src_score = src.data();
    p.dst_score = dst.data();
    p.negative_slope = slope;
    p.value = value.data();
    p.out = out.data();
    p.stats = stats.data();
    gnnio::wsb_attention_forward_cpu(p);
    b.grad_out = dout.data();
    b.block_rowptr_t = wt.block_rowptr.data();
    b.block_col_t = wt.block_col.data();
    b.count_t = count_t.data();
    b.delta = delta.data();
    b.grad_src_score = gs.data();
    b.grad_dst_score = gd.data();
    b.grad_value = gv.data();
    gnnio::wsb_attention_backward_cpu(b);

    auto z_of = [&](int64_t e, int64_t h) { return src[g.col[e] * H + h] + dst[g.row[e] * H + h]; };
    auto leaky = [&](double z) { return z > 0 ? z : z * slope; };
    std::vector<double> m(nd * H, -INFINITY), s(nd * H, 0.0);
    for (int64_t e = 0; e < E; ++e)
      for (int64_t h = 0; h < H; ++h) m[g.row[e] * H + h] = std::max(m[g.row[e] * H + h], leaky(z_of(e, h)));
    for (auto& v : m) v = std::isinf(v) ? 0.0 : v;
    for (int64_t e = 0; e < E; ++e)
      for (int64_t h = 0; h < H; ++h) s[g.row[e] * H + h] += std::exp(leaky(z_of(e, h)) - m[g.row[e] * H + h]);
    std::vector<double> ref(nd * H * C, 0.0), rgs(ns * H, 0.0), rgd(nd * H, 0.0), rgv(ns * H * C, 0.0),
        D(nd * H, 0.0);
    auto weight = [&](int64_t e, int64_t h) {
      const int64_t ih = g.row[e] * H + h;
      return std::exp(leaky(z_of(e, h)) - m[ih]) / (s[ih] + 1e-16);
    };
    for (int64_t e = 0; e < E; ++e)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t c = 0; c < C; ++c)
          ref[(g.row[e] * H + h) * C + c] += weight(e, h) * value[(g.col[e] * H + h) * C + c];
    for (int64_t ih = 0; ih < nd * H; ++ih)
      for (int64_t c = 0; c < C; ++c) D[ih] += dout[ih * C + c] * ref[ih * C + c];
    for (int64_t e = 0; e < E; ++e)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t i = g.row[e], j = g.col[e];
        double dp = 0;
        for (int64_t c = 0; c < C; ++c) {
          dp += dout[(i * H + h) * C + c] * value[(j * H + h) * C + c];
          rgv[(j * H + h) * C + c] += weight(e, h) * dout[(i * H + h) * C + c];
        }
        const double dz = weight(e, h) * (dp - D[i * H + h]) * (z_of(e, h) > 0 ? 1.0 : slope);
        rgs[j * H + h] += dz;
        rgd[i * H + h] += dz;
      }
    // float64 throughout, sums of at most a few hundred O(1) terms: 1e-12 is ~4500 ulp of 1.
    for (int64_t x = 0; x < nd * H * C; ++x) ASSERT_NEAR(out[x], ref[x], 1e-12) << name << " out " << x;
    for (int64_t x = 0; x < nd * H; ++x) {
      ASSERT_NEAR(stats[2 * x], m[x], 1e-12) << name << " max " << x;
      ASSERT_NEAR(stats[2 * x + 1], s[x] + 1e-16, 1e-12 * (1 + s[x])) << name << " sum " << x;
      ASSERT_NEAR(gd[x], rgd[x], 1e-12) << name << " d dst_score " << x;
    }
    for (int64_t x = 0; x < ns * H; ++x) ASSERT_NEAR(gs[x], rgs[x], 1e-12) << name << " d src_score " << x;
    for (int64_t x = 0; x < ns * H * C; ++x) ASSERT_NEAR(gv[x], rgv[x], 1e-12) << name << " d value " << x;
  }
}
