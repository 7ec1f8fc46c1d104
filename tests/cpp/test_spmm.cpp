#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "gnnio/graph/csr.h"
#include "gnnio/spmm/params.h"

namespace {

struct RandomGraph {
  int64_t num_rows, num_cols;
  std::vector<int64_t> rowptr, col, perm;
};

RandomGraph random_graph(std::mt19937_64& rng, int64_t num_rows, int64_t num_cols,
                         int64_t num_edges) {
  std::vector<int64_t> row(num_edges), col(num_edges);
  for (auto& r : row) r = rng() % num_rows;
  for (auto& c : col) c = rng() % num_cols;
  RandomGraph g{num_rows, num_cols, std::vector<int64_t>(num_rows + 1),
                std::vector<int64_t>(num_edges), std::vector<int64_t>(num_edges)};
  gnnio::CsrBuildParams p;
  p.row = row.data();
  p.col = col.data();
  p.num_edges = num_edges;
  p.num_rows = num_rows;
  p.num_cols = num_cols;
  p.rowptr = g.rowptr.data();
  p.col_sorted = g.col.data();
  p.perm = g.perm.data();
  gnnio::csr_build_cpu(p);
  return g;
}

// Dense float64 reference: out = A · x with A[r][col] += value.
std::vector<double> dense_reference(const RandomGraph& g, const std::vector<float>& value,
                                    const std::vector<float>& x, int64_t width) {
  std::vector<double> out(g.num_rows * width, 0.0);
  for (int64_t r = 0; r < g.num_rows; ++r)
    for (int64_t k = g.rowptr[r]; k < g.rowptr[r + 1]; ++k)
      for (int64_t f = 0; f < width; ++f)
        out[r * width + f] += double(value[k]) * double(x[g.col[k] * width + f]);
  return out;
}

TEST(SpmmCpu, MatchesFloat64ReferenceOnOddShapes) {
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<float> normal;
  for (int64_t width : {1, 3, 33, 130}) {
    auto g = random_graph(rng, 37, 53, 600);
    std::vector<float> value(600), x(53 * width), out(37 * width, -1.f);
    for (auto& v : value) v = normal(rng);
    for (auto& v : x) v = normal(rng);
    gnnio::SpmmParams p;
    p.rowptr = g.rowptr.data();
    p.col = g.col.data();
    p.value = value.data();
    p.x = x.data();
    p.out = out.data();
    p.num_rows = 37;
    p.num_cols = 53;
    p.nnz = 600;
    p.width = width;
    p.x_row_stride = p.out_row_stride = width;
    gnnio::spmm_cpu(p);
    const auto ref = dense_reference(g, value, x, width);
    for (size_t i = 0; i < out.size(); ++i)
      // float32 accumulation over ~16 terms of unit size: 1e-5 relative is ~100 ulp of headroom.
      ASSERT_NEAR(out[i], ref[i], 1e-5 * (1 + std::abs(ref[i]))) << "width " << width << " i " << i;
  }
}

TEST(SpmmCpu, UnitWeightsAndIsolatedRowsGiveZero) {
  std::mt19937_64 rng(7);
  RandomGraph g{3, 2, {0, 0, 2, 2}, {0, 1}, {0, 1}};  // row 0 and row 2 have no neighbours
  std::vector<float> x{1, 2, 3, 4}, out(6, 99.f);
  gnnio::SpmmParams p;
  p.rowptr = g.rowptr.data();
  p.col = g.col.data();
  p.x = x.data();
  p.out = out.data();
  p.num_rows = 3;
  p.num_cols = 2;
  p.nnz = 2;
  p.width = 2;
  p.x_row_stride = p.out_row_stride = 2;
  gnnio::spmm_cpu(p);
  EXPECT_EQ(out, (std::vector<float>{0, 0, 4, 6, 0, 0}));
}

TEST(SddmmCpu, MatchesDotProducts) {
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal;
  const int64_t width = 5;
  auto g = random_graph(rng, 11, 13, 90);
  std::vector<double> a(11 * width), b(13 * width), out(90);
  for (auto& v : a) v = normal(rng);
  for (auto& v : b) v = normal(rng);
  gnnio::SddmmParams p;
  p.rowptr = g.rowptr.data();
  p.col = g.col.data();
  p.a = a.data();
  p.b = b.data();
  p.out = out.data();
  p.scalar_type = gnnio::ScalarType::kFloat64;
  p.num_rows = 11;
  p.nnz = 90;
  p.width = width;
  p.a_row_stride = p.b_row_stride = width;
  gnnio::sddmm_cpu(p);
  for (int64_t r = 0; r < 11; ++r)
    for (int64_t k = g.rowptr[r]; k < g.rowptr[r + 1]; ++k) {
      double ref = 0;
      for (int64_t f = 0; f < width; ++f) ref += a[r * width + f] * b[g.col[k] * width + f];
      ASSERT_NEAR(out[k], ref, 1e-12);
    }
}

}  // namespace
