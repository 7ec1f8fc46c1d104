// The CPU attention kernels (kGat, kGatV2, kDot) against an independent dense reference (forward)
// and against central finite differences (backward), on a small graph with an isolated
// destination, a source without out-edges and duplicate edges, with every optional operand on and
// off and with and without dropout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "gnnio/attention/dropout.h"
#include "gnnio/attention/params.h"
#include "gnnio/graph/csr.h"

namespace {

using gnnio::ScoreKind;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct Csr {
  std::vector<int64_t> rowptr, col, perm;
};

Csr build(const std::vector<int64_t>& row, const std::vector<int64_t>& col, int64_t num_rows,
          int64_t num_cols) {
  Csr c{std::vector<int64_t>(num_rows + 1), std::vector<int64_t>(row.size()),
        std::vector<int64_t>(row.size())};
  gnnio::CsrBuildParams p;
  p.row = row.data();
  p.col = col.data();
  p.num_edges = static_cast<int64_t>(row.size());
  p.num_rows = num_rows;
  p.num_cols = num_cols;
  p.rowptr = c.rowptr.data();
  p.col_sorted = c.col.data();
  p.perm = c.perm.data();
  gnnio::csr_build_cpu(p);
  return c;
}

struct Graph {
  int64_t num_dst = 0, num_src = 0, nnz = 0;
  std::vector<int64_t> rowptr, col;           // csr_by_dst
  std::vector<int64_t> rowptr_t, col_t, t2c;  // csr_by_src, and the csr_by_dst slot of each slot
};

// Random edges that avoid destination 1 (isolated, and not the last row, to catch row offsets)
// and the last source (no out-edges: its gradients must still be written, as zeros), plus
// duplicates of the first edges (parallel edges are separate slots with separate weights).
Graph make_graph(std::mt19937_64& rng, int64_t num_dst, int64_t num_src, int64_t num_edges) {
  std::vector<int64_t> dst, src;
  for (int64_t e = 0; e < num_edges; ++e) {
    int64_t i = rng() % (num_dst - 1);
    dst.push_back(i >= 1 ? i + 1 : i);
    src.push_back(rng() % (num_src - 1));
  }
  for (int64_t e : {0, 0, 1, 2}) dst.push_back(dst[e]), src.push_back(src[e]);
  const Csr by_dst = build(dst, src, num_dst, num_src), by_src = build(src, dst, num_src, num_dst);
  Graph g;
  g.num_dst = num_dst;
  g.num_src = num_src;
  g.nnz = static_cast<int64_t>(dst.size());
  g.rowptr = by_dst.rowptr;
  g.col = by_dst.col;
  g.rowptr_t = by_src.rowptr;
  g.col_t = by_src.col;
  std::vector<int64_t> slot_of_edge(g.nnz);
  for (int64_t k = 0; k < g.nnz; ++k) slot_of_edge[by_dst.perm[k]] = k;
  g.t2c.resize(g.nnz);
  for (int64_t t = 0; t < g.nnz; ++t) g.t2c[t] = slot_of_edge[by_src.perm[t]];
  return g;
}

struct Config {
  ScoreKind kind = ScoreKind::kGat;
  bool dst_score = false, edge_score = false, edge_key = false, edge_value = false;
  double dropout = 0.0;
  bool value_is_key = false;  // value aliases key (GATv2's x_l serves as both)
};

std::string describe(const Config& c) {
  const char* kinds[] = {"gat", "gatv2", "dot"};
  std::string s = kinds[static_cast<int>(c.kind)];
  if (c.dst_score) s += " +dst_score";
  if (c.edge_score) s += " +edge_score";
  if (c.edge_key) s += " +edge_key";
  if (c.edge_value) s += " +edge_value";
  if (c.value_is_key) s += " value=key";
  return s + " dropout=" + std::to_string(c.dropout);
}

// Every combination of the kind's optional operands, each with dropout 0 and 0.3.
std::vector<Config> all_configs() {
  std::vector<Config> out;
  for (double dropout : {0.0, 0.3}) {
    for (int bits = 0; bits < 8; ++bits) {
      Config c;
      c.kind = ScoreKind::kGat;
      c.dst_score = bits & 1, c.edge_score = bits & 2, c.edge_value = bits & 4;
      c.dropout = dropout;
      out.push_back(c);
    }
    for (ScoreKind kind : {ScoreKind::kGatV2, ScoreKind::kDot})
      for (int bits = 0; bits < 4; ++bits) {
        Config c;
        c.kind = kind;
        c.edge_key = bits & 1, c.edge_value = bits & 2;
        c.dropout = dropout;
        out.push_back(c);
      }
    Config alias;
    alias.kind = ScoreKind::kGatV2;
    alias.value_is_key = true;
    alias.dropout = dropout;
    out.push_back(alias);
  }
  return out;
}

// One problem: graph, configuration and operands in float64 (float32-representable, so that a
// float32 run sees exactly the same inputs). An absent operand is an empty vector.
struct Problem {
  Graph g;
  Config cfg;
  int64_t H = 2, C = 3;
  double slope = 0.2, scale = 0.7;
  uint64_t seed = 0x5eed;
  std::map<std::string, std::vector<double>> x;  // operand name -> data

  const std::vector<double>& get(const std::string& name) const {
    static const std::vector<double> none;
    auto it = x.find(name);
    return it == x.end() ? none : it->second;
  }
  // value_is_key: the value operand is the key tensor itself.
  const std::vector<double>& value() const { return cfg.value_is_key ? get("key") : get("value"); }
};

Problem make_problem(const Graph& g, const Config& cfg, uint64_t data_seed, int64_t H = 2,
                     int64_t C = 3) {
  Problem pb;
  pb.g = g;
  pb.cfg = cfg;
  pb.H = H;
  pb.C = C;
  std::mt19937_64 rng(data_seed);
  std::normal_distribution<float> normal;
  auto draw = [&](const std::string& name, int64_t n) {
    auto& v = pb.x[name];
    v.resize(n);
    for (auto& e : v) e = normal(rng);
  };
  const int64_t E = g.nnz;
  if (cfg.kind == ScoreKind::kGat) {
    draw("src_score", g.num_src * H);
    if (cfg.dst_score) draw("dst_score", g.num_dst * H);
    if (cfg.edge_score) draw("edge_score", E * H);
  } else {
    draw("query", g.num_dst * H * C);
    draw("key", g.num_src * H * C);
    if (cfg.edge_key) draw("edge_key", E * H * C);
    if (cfg.kind == ScoreKind::kGatV2) draw("att", H * C);
  }
  if (!cfg.value_is_key) draw("value", g.num_src * H * C);
  if (cfg.edge_value) draw("edge_value", E * H * C);
  return pb;
}

struct Forward {
  std::vector<double> out, stats, weights;
};

// The contract of params.h, written out directly: materialise every score, then PyG's softmax,
// then the dropout mask, then the weighted sum of messages.
Forward reference_forward(const Problem& pb) {
  const Graph& g = pb.g;
  const int64_t H = pb.H, C = pb.C, E = g.nnz;
  auto opt = [](const std::vector<double>& v, int64_t idx) { return v.empty() ? 0.0 : v[idx]; };
  auto lrelu = [&](double z) { return z > 0 ? z : pb.slope * z; };
  const auto &src = pb.get("src_score"), &dst = pb.get("dst_score"), &es = pb.get("edge_score");
  const auto &q = pb.get("query"), &key = pb.get("key"), &ek = pb.get("edge_key");
  const auto &att = pb.get("att"), &val = pb.value(), &ev = pb.get("edge_value");

  std::vector<double> score(E * H);
  for (int64_t i = 0; i < g.num_dst; ++i)
    for (int64_t k = g.rowptr[i]; k < g.rowptr[i + 1]; ++k) {
      const int64_t j = g.col[k];
      for (int64_t h = 0; h < H; ++h) {
        double e = 0;
        if (pb.cfg.kind == ScoreKind::kGat) {
          e = lrelu(src[j * H + h] + opt(dst, i * H + h) + opt(es, k * H + h));
        } else {
          for (int64_t c = 0; c < C; ++c) {
            const double kk = key[(j * H + h) * C + c] + opt(ek, (k * H + h) * C + c);
            const double qq = q[(i * H + h) * C + c];
            e += pb.cfg.kind == ScoreKind::kGatV2 ? att[h * C + c] * lrelu(kk + qq) : qq * kk;
          }
          if (pb.cfg.kind == ScoreKind::kDot) e *= pb.scale;
        }
        score[k * H + h] = e;
      }
    }

  Forward f{std::vector<double>(g.num_dst * H * C, 0.0), std::vector<double>(g.num_dst * H * 2),
            std::vector<double>(E * H)};
  for (int64_t i = 0; i < g.num_dst; ++i)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t begin = g.rowptr[i], end = g.rowptr[i + 1];
      double m = 0, s = 1e-16;
      if (begin < end) {
        m = -std::numeric_limits<double>::infinity();
        for (int64_t k = begin; k < end; ++k) m = std::max(m, score[k * H + h]);
        for (int64_t k = begin; k < end; ++k) s += std::exp(score[k * H + h] - m);
      }
      f.stats[(i * H + h) * 2] = m;
      f.stats[(i * H + h) * 2 + 1] = s;
      for (int64_t k = begin; k < end; ++k) {
        const bool keep = gnnio::dropout_keep(pb.seed, k, h, H, pb.cfg.dropout);
        const double w = std::exp(score[k * H + h] - m) / s * (keep ? 1.0 / (1.0 - pb.cfg.dropout) : 0.0);
        f.weights[k * H + h] = w;
        const int64_t j = g.col[k];
        for (int64_t c = 0; c < C; ++c)
          f.out[(i * H + h) * C + c] += w * (val[(j * H + h) * C + c] + opt(ev, (k * H + h) * C + c));
      }
    }
  return f;
}

// The problem in the kernel's element and index types, and the params that point into it.
template <typename T, typename I>
struct Typed {
  std::map<std::string, std::vector<T>> x;
  std::vector<I> rowptr, col, rowptr_t, col_t, t2c;

  explicit Typed(const Problem& pb) {
    for (const auto& [name, v] : pb.x) x[name] = std::vector<T>(v.begin(), v.end());
    auto idx = [](const std::vector<int64_t>& v) { return std::vector<I>(v.begin(), v.end()); };
    rowptr = idx(pb.g.rowptr), col = idx(pb.g.col);
    rowptr_t = idx(pb.g.rowptr_t), col_t = idx(pb.g.col_t), t2c = idx(pb.g.t2c);
  }
  const T* ptr(const std::string& name) const {
    auto it = x.find(name);
    return it == x.end() ? nullptr : it->second.data();
  }
  gnnio::AttentionParams params(const Problem& pb) const {
    gnnio::AttentionParams p;
    p.rowptr = rowptr.data();
    p.col = col.data();
    p.index_type = sizeof(I) == 4 ? gnnio::IndexType::kInt32 : gnnio::IndexType::kInt64;
    p.kind = pb.cfg.kind;
    p.scalar_type = sizeof(T) == 4 ? gnnio::ScalarType::kFloat32 : gnnio::ScalarType::kFloat64;
    p.num_dst = pb.g.num_dst;
    p.num_src = pb.g.num_src;
    p.nnz = pb.g.nnz;
    p.heads = pb.H;
    p.channels = pb.C;
    p.src_score = ptr("src_score");
    p.dst_score = ptr("dst_score");
    p.edge_score = ptr("edge_score");
    p.query = ptr("query");
    p.key = ptr("key");
    p.edge_key = ptr("edge_key");
    p.att = ptr("att");
    p.negative_slope = pb.slope;
    p.scale = pb.scale;
    p.value = pb.cfg.value_is_key ? ptr("key") : ptr("value");
    p.edge_value = ptr("edge_value");
    p.dropout = pb.cfg.dropout;
    p.seed = pb.seed;
    return p;
  }
};

template <typename T>
std::vector<double> to_double(const std::vector<T>& v) {
  return std::vector<double>(v.begin(), v.end());
}

// Output buffers start as NaN, so an entry the kernel never writes fails every comparison.
template <typename T, typename I = int64_t>
Forward run_forward(const Problem& pb, bool with_weights = true) {
  const Typed<T, I> t(pb);
  std::vector<T> out(pb.g.num_dst * pb.H * pb.C, T(kNaN)), stats(pb.g.num_dst * pb.H * 2, T(kNaN)),
      weights(with_weights ? pb.g.nnz * pb.H : 0, T(kNaN));
  gnnio::AttentionParams p = t.params(pb);
  p.out = out.data();
  p.stats = stats.data();
  p.weights = with_weights ? weights.data() : nullptr;
  gnnio::attention_forward_cpu(p);
  return {to_double(out), to_double(stats), to_double(weights)};
}

// The gradients a kind has (autograd asks only for those of operands that are present).
std::vector<std::string> gradient_names(const Problem& pb) {
  std::vector<std::string> names;
  for (const auto& [name, v] : pb.x) names.push_back(name);
  if (pb.cfg.value_is_key) names.push_back("value");  // a separate output even when aliased
  return names;
}

using Grads = std::map<std::string, std::vector<double>>;

// Forward in T, then backward of the loss sum(out * G) for the requested gradients. "att" is
// returned summed over destinations, as the binding does with grad_att_partial.
template <typename T, typename I = int64_t>
Grads run_backward(const Problem& pb, const std::vector<double>& G,
                   const std::vector<std::string>& wanted) {
  const Typed<T, I> t(pb);
  const Graph& g = pb.g;
  const int64_t H = pb.H, C = pb.C;
  std::vector<T> out(g.num_dst * H * C, T(kNaN)), stats(g.num_dst * H * 2, T(kNaN));
  gnnio::AttentionBackwardParams b;
  b.fwd = t.params(pb);
  b.fwd.out = out.data();
  b.fwd.stats = stats.data();
  gnnio::attention_forward_cpu(b.fwd);

  const std::vector<T> grad_out(G.begin(), G.end());
  std::vector<T> delta(g.num_dst * H, T(kNaN));
  b.grad_out = grad_out.data();
  b.delta = delta.data();
  b.rowptr_t = t.rowptr_t.data();
  b.col_t = t.col_t.data();
  b.t2c = t.t2c.data();
  const std::map<std::string, int64_t> sizes{
      {"src_score", g.num_src * H}, {"dst_score", g.num_dst * H}, {"edge_score", g.nnz * H},
      {"query", g.num_dst * H * C}, {"key", g.num_src * H * C},   {"edge_key", g.nnz * H * C},
      {"att", g.num_dst * H * C},   {"value", g.num_src * H * C}, {"edge_value", g.nnz * H * C}};
  const std::map<std::string, void**> slots{
      {"src_score", &b.grad_src_score}, {"dst_score", &b.grad_dst_score},
      {"edge_score", &b.grad_edge_score}, {"query", &b.grad_query},
      {"key", &b.grad_key},             {"edge_key", &b.grad_edge_key},
      {"att", &b.grad_att_partial},     {"value", &b.grad_value},
      {"edge_value", &b.grad_edge_value}};
  std::map<std::string, std::vector<T>> buffers;
  for (const auto& name : wanted) {
    buffers[name].assign(sizes.at(name), T(kNaN));
    *slots.at(name) = buffers[name].data();
  }
  gnnio::attention_backward_cpu(b);

  Grads grads;
  for (const auto& [name, v] : buffers) grads[name] = to_double(v);
  if (grads.count("att")) {  // grad_att_partial [num_dst, H, C] -> d att [H, C]
    std::vector<double> att(H * C, 0.0);
    for (int64_t i = 0; i < g.num_dst; ++i)
      for (int64_t hc = 0; hc < H * C; ++hc) att[hc] += grads["att"][i * H * C + hc];
    grads["att"] = att;
  }
  return grads;
}

std::vector<double> random_grad_out(const Problem& pb, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<double> G(pb.g.num_dst * pb.H * pb.C);
  for (auto& v : G) v = normal(rng);
  return G;
}

double loss(const Problem& pb, const std::vector<double>& G) {
  const Forward f = run_forward<double>(pb, false);
  double l = 0;
  for (size_t x = 0; x < G.size(); ++x) l += f.out[x] * G[x];
  return l;
}

Graph small_graph() {
  std::mt19937_64 rng(42);
  return make_graph(rng, 6, 5, 18);  // 22 slots over 5 destinations: several per row
}

int64_t dropped_slots(const Problem& pb) {
  int64_t n = 0;
  for (int64_t k = 0; k < pb.g.nnz; ++k)
    for (int64_t h = 0; h < pb.H; ++h) n += !gnnio::dropout_keep(pb.seed, k, h, pb.H, pb.cfg.dropout);
  return n;
}

void expect_close(const std::vector<double>& got, const std::vector<double>& want, double rtol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t x = 0; x < want.size(); ++x)
    ASSERT_NEAR(got[x], want[x], rtol * (1.0 + std::abs(want[x]))) << what << " [" << x << "]";
}

TEST(AttentionCpu, GraphHasTheEdgeCasesTheTestsRelyOn) {
  const Graph g = small_graph();
  EXPECT_EQ(g.rowptr[1], g.rowptr[2]) << "destination 1 must be isolated";
  EXPECT_EQ(g.rowptr_t[g.num_src - 1], g.rowptr_t[g.num_src]) << "last source must have no edges";
  int64_t parallel = 0;  // slots whose (row, source) repeats within the row
  for (int64_t i = 0; i < g.num_dst; ++i)
    for (int64_t k = g.rowptr[i]; k < g.rowptr[i + 1]; ++k)
      for (int64_t l = g.rowptr[i]; l < k; ++l) parallel += g.col[l] == g.col[k];
  EXPECT_GE(parallel, 3);
  const Problem pb = make_problem(g, Config{ScoreKind::kGat, false, false, false, false, 0.3}, 1);
  const int64_t dropped = dropped_slots(pb);
  EXPECT_GT(dropped, 0) << "dropout 0.3 must drop some of the weights";
  EXPECT_LT(dropped, g.nnz * pb.H) << "and keep some";
}

// Forward vs the dense reference. float64 differs only by summation order and the online
// rescaling (a few ulp); float32 sees the same (float-representable) inputs and accumulates in
// double, so only the final rounding to float32 (<= 2^-24 relative) separates it.
TEST(AttentionCpu, ForwardMatchesDenseReference) {
  const Graph g = small_graph();
  for (const Config& cfg : all_configs()) {
    SCOPED_TRACE(describe(cfg));
    const Problem pb = make_problem(g, cfg, 7);
    const Forward ref = reference_forward(pb);
    const Forward f64 = run_forward<double>(pb), f32 = run_forward<float>(pb);
    const Forward f64_i32 = run_forward<double, int32_t>(pb);
    expect_close(f64.out, ref.out, 1e-12, "out f64");
    expect_close(f64.stats, ref.stats, 1e-12, "stats f64");
    expect_close(f64.weights, ref.weights, 1e-12, "weights f64");
    expect_close(f32.out, ref.out, 1e-6, "out f32");
    expect_close(f32.stats, ref.stats, 1e-6, "stats f32");
    expect_close(f32.weights, ref.weights, 1e-6, "weights f32");
    EXPECT_EQ(f64_i32.out, f64.out) << "int32 indices must give the int64 result";
    EXPECT_EQ(f64_i32.weights, f64.weights);
    // The isolated destination: out 0, stats (0, 1e-16).
    for (int64_t h = 0; h < pb.H; ++h) {
      EXPECT_EQ(f64.stats[(1 * pb.H + h) * 2], 0.0);
      EXPECT_EQ(f64.stats[(1 * pb.H + h) * 2 + 1], 1e-16);
      for (int64_t c = 0; c < pb.C; ++c) EXPECT_EQ(f64.out[(1 * pb.H + h) * pb.C + c], 0.0);
    }
  }
}

// Without dropout each non-empty row's weights sum to 1 - 1e-16 / s (PyG's softmax); with it,
// the kept weights carry the 1 / (1 - p) factor and the dropped ones are exactly 0.
TEST(AttentionCpu, WeightsAreTheDroppedOutSoftmax) {
  const Graph g = small_graph();
  for (double dropout : {0.0, 0.3}) {
    Config cfg;
    cfg.kind = ScoreKind::kDot;
    cfg.dropout = dropout;
    const Problem pb = make_problem(g, cfg, 3);
    const Forward f = run_forward<double>(pb);
    for (int64_t i = 0; i < g.num_dst; ++i)
      for (int64_t h = 0; h < pb.H; ++h) {
        double sum = 0;
        for (int64_t k = g.rowptr[i]; k < g.rowptr[i + 1]; ++k) {
          const double w = f.weights[k * pb.H + h];
          if (!gnnio::dropout_keep(pb.seed, k, h, pb.H, dropout)) {
            EXPECT_EQ(w, 0.0);
            continue;
          }
          sum += w * (1.0 - dropout);
        }
        if (dropout == 0 && g.rowptr[i] < g.rowptr[i + 1]) EXPECT_NEAR(sum, 1.0, 1e-12);
        if (dropout > 0) EXPECT_LE(sum, 1.0 + 1e-12);
      }
  }
}

// Backward (float64) vs central differences of L = sum(out * G).
// Tolerance: with eps = 1e-6 the truncation error is eps^2 / 6 * |L'''| ~ 1e-12 for O(1)
// operands, and the rounding error is ~ |L| * 2^-52 / eps ~ 1e-9 for |L| ~ 10, so 1e-6 * (1 + |g|)
// leaves three orders of magnitude of margin while a missing term, a wrong slot or a wrong
// factor (slope, scale, 1 / (1 - p)) shows up as an O(0.01 .. 1) error. The LeakyReLU kinks
// are at z = 0; with these seeds no pre-activation lies within eps of one.
TEST(AttentionCpu, BackwardMatchesFiniteDifferences) {
  const Graph g = small_graph();
  const double eps = 1e-6;
  for (const Config& cfg : all_configs()) {
    SCOPED_TRACE(describe(cfg));
    Problem pb = make_problem(g, cfg, 11);
    const std::vector<double> G = random_grad_out(pb, 13);
    const Grads grads = run_backward<double>(pb, G, gradient_names(pb));
    for (auto& [name, data] : pb.x) {
      // Perturbing an aliased key moves both the score and the value: d key + d value.
      std::vector<double> analytic = grads.at(name);
      if (name == "key" && cfg.value_is_key)
        for (size_t x = 0; x < analytic.size(); ++x) analytic[x] += grads.at("value")[x];
      ASSERT_EQ(analytic.size(), data.size()) << name;
      for (size_t x = 0; x < data.size(); ++x) {
        const double keep = data[x];
        data[x] = keep + eps;
        const double up = loss(pb, G);
        data[x] = keep - eps;
        const double down = loss(pb, G);
        data[x] = keep;
        const double fd = (up - down) / (2 * eps);
        ASSERT_NEAR(analytic[x], fd, 1e-6 * (1.0 + std::abs(fd))) << name << " [" << x << "]";
      }
    }
    if (!pb.get("value").empty() || cfg.value_is_key) {
      // The source without out-edges gets written zeros, not left alone.
      const auto& dv = grads.at("value");
      for (int64_t hc = 0; hc < pb.H * pb.C; ++hc)
        EXPECT_EQ(dv[(g.num_src - 1) * pb.H * pb.C + hc], 0.0);
    }
  }
}

// Each gradient is its own output: asking for one alone gives the same bits as asking for all
// (so a nullptr really is skipped, and no output depends on another one being requested).
TEST(AttentionCpu, EachGradientAloneGivesTheSameBits) {
  const Graph g = small_graph();
  for (const Config& cfg : all_configs()) {
    SCOPED_TRACE(describe(cfg));
    const Problem pb = make_problem(g, cfg, 17);
    const std::vector<double> G = random_grad_out(pb, 19);
    const std::vector<std::string> names = gradient_names(pb);
    const Grads all = run_backward<double>(pb, G, names);
    for (const auto& name : names) {
      const Grads one = run_backward<double>(pb, G, {name});
      EXPECT_EQ(one.at(name), all.at(name)) << name;
    }
    // No gradient at all: only delta is written; must not throw or touch anything else.
    EXPECT_NO_THROW(run_backward<double>(pb, G, {}));
  }
}

// float32 runs the same algorithm on the same inputs, accumulating in double; what separates it
// from float64 is the rounding of out, stats and delta to float32 (~6e-8 relative, times |m| in
// exp(e - m)) and of the outputs, so 1e-5 * (1 + |g|) is a loose bound. int32 indices must not
// change a bit.
TEST(AttentionCpu, BackwardFloat32AndInt32AgreeWithFloat64) {
  const Graph g = small_graph();
  for (const Config& cfg : all_configs()) {
    SCOPED_TRACE(describe(cfg));
    const Problem pb = make_problem(g, cfg, 23);
    const std::vector<double> G = random_grad_out(pb, 29);
    const std::vector<std::string> names = gradient_names(pb);
    const Grads f64 = run_backward<double>(pb, G, names);
    const Grads f32 = run_backward<float>(pb, G, names);
    const Grads i32 = run_backward<double, int32_t>(pb, G, names);
    for (const auto& name : names) {
      expect_close(f32.at(name), f64.at(name), 1e-5, name + " f32");
      EXPECT_EQ(i32.at(name), f64.at(name)) << name << " int32";
    }
  }
}

// A graph large enough to wake the OpenMP team: forward still matches the reference, and the
// backward gives the same bits with one thread and with several (each output has one owner).
TEST(AttentionCpu, ThreadedRunsMatchReferenceAndAreDeterministic) {
  std::mt19937_64 rng(5);
  const Graph g = make_graph(rng, 1500, 1200, 12000);  // nnz * H * C ~ 200K > the 64K threshold
  for (ScoreKind kind : {ScoreKind::kGat, ScoreKind::kGatV2, ScoreKind::kDot}) {
    Config cfg;
    cfg.kind = kind;
    cfg.dst_score = cfg.edge_score = cfg.edge_key = cfg.edge_value = true;
    if (kind != ScoreKind::kGat) cfg.dst_score = cfg.edge_score = false;
    if (kind == ScoreKind::kGat) cfg.edge_key = false;
    cfg.dropout = 0.3;
    SCOPED_TRACE(describe(cfg));
    const Problem pb = make_problem(g, cfg, 31, 2, 8);
    const Forward ref = reference_forward(pb);
    const Forward f = run_forward<double>(pb);
    expect_close(f.out, ref.out, 1e-12, "out");
    expect_close(f.weights, ref.weights, 1e-12, "weights");
    const std::vector<double> G = random_grad_out(pb, 37);
    const std::vector<std::string> names = gradient_names(pb);
    const Grads many = run_backward<float>(pb, G, names);
#ifdef _OPENMP
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    const Grads one = run_backward<float>(pb, G, names);
    omp_set_num_threads(threads);
#else
    const Grads one = run_backward<float>(pb, G, names);
#endif
    for (const auto& name : names) EXPECT_EQ(many.at(name), one.at(name)) << name;
  }
}

// No edges at all, with the nullptr data pointers that empty tensors give (col, col_t, t2c):
// every row is empty, and every requested gradient is written as zeros.
TEST(AttentionCpu, EdgelessGraphWritesZeros) {
  const int64_t num_dst = 3, num_src = 2, H = 2, C = 3;
  const std::vector<int64_t> rowptr(num_dst + 1, 0), rowptr_t(num_src + 1, 0);
  const std::vector<double> query(num_dst * H * C, 1.0), key(num_src * H * C, 1.0),
      att(H * C, 1.0), grad_out(num_dst * H * C, 1.0);
  std::vector<double> out(num_dst * H * C, kNaN), stats(num_dst * H * 2, kNaN);
  gnnio::AttentionBackwardParams b;
  gnnio::AttentionParams& p = b.fwd;
  p.rowptr = rowptr.data();
  p.kind = ScoreKind::kGatV2;
  p.scalar_type = gnnio::ScalarType::kFloat64;
  p.num_dst = num_dst, p.num_src = num_src, p.heads = H, p.channels = C;
  p.query = query.data(), p.key = key.data(), p.att = att.data(), p.value = key.data();
  p.out = out.data(), p.stats = stats.data();
  p.dropout = 0.3;
  gnnio::attention_forward_cpu(p);
  EXPECT_EQ(out, std::vector<double>(out.size(), 0.0));
  for (int64_t r = 0; r < num_dst * H; ++r) {
    EXPECT_EQ(stats[2 * r], 0.0);
    EXPECT_EQ(stats[2 * r + 1], 1e-16);
  }
  std::vector<double> delta(num_dst * H, kNaN), gq(query.size(), kNaN), gk(key.size(), kNaN),
      gv(key.size(), kNaN), ga(num_dst * H * C, kNaN);
  b.grad_out = grad_out.data();
  b.rowptr_t = rowptr_t.data();
  b.delta = delta.data();
  b.grad_query = gq.data(), b.grad_key = gk.data(), b.grad_value = gv.data();
  b.grad_att_partial = ga.data();
  gnnio::attention_backward_cpu(b);
  for (const auto* v : {&delta, &gq, &gk, &gv, &ga}) EXPECT_EQ(*v, std::vector<double>(v->size(), 0.0));
}

TEST(AttentionCpu, RejectsWhatTheCpuPathDoesNotDo) {
  const Graph g = small_graph();
  Config cfg;
  cfg.kind = ScoreKind::kGat;
  const Problem pb = make_problem(g, cfg, 41);
  const Typed<float, int64_t> t(pb);
  std::vector<float> out(g.num_dst * pb.H * pb.C), stats(g.num_dst * pb.H * 2);
  gnnio::AttentionParams p = t.params(pb);
  p.out = out.data();
  p.stats = stats.data();
  auto kind_of = [](const std::function<void()>& fn) {
    try {
      fn();
    } catch (const gnnio::Error& e) {
      return static_cast<int>(e.kind());
    }
    return -1;
  };
  const int invalid = static_cast<int>(gnnio::ErrorKind::kInvalidArgument);
  gnnio::AttentionParams half = p;
  half.scalar_type = gnnio::ScalarType::kFloat16;
  EXPECT_EQ(kind_of([&] { gnnio::attention_forward_cpu(half); }),
            static_cast<int>(gnnio::ErrorKind::kType));
  gnnio::AttentionParams no_src = p;
  no_src.src_score = nullptr;
  EXPECT_EQ(kind_of([&] { gnnio::attention_forward_cpu(no_src); }), invalid);
  gnnio::AttentionParams bad_dropout = p;
  bad_dropout.dropout = 1.0;
  EXPECT_EQ(kind_of([&] { gnnio::attention_forward_cpu(bad_dropout); }), invalid);

  gnnio::attention_forward_cpu(p);
  std::vector<float> grad_out(out.size(), 1.f), delta(g.num_dst * pb.H), gq(out.size());
  gnnio::AttentionBackwardParams b;
  b.fwd = p;
  b.grad_out = grad_out.data();
  b.delta = delta.data();
  b.grad_query = gq.data();  // kGat has no query
  EXPECT_EQ(kind_of([&] { gnnio::attention_backward_cpu(b); }), invalid);
}

}  // namespace
