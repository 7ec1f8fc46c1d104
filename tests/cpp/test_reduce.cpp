#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "gnnio/graph/csr.h"
#include "gnnio/reduce/params.h"

namespace {

struct Csr {
  std::vector<int64_t> rowptr, col, perm;
};

Csr build(const std::vector<int64_t>& row, const std::vector<int64_t>& col, int64_t n) {
  Csr c{std::vector<int64_t>(n + 1), std::vector<int64_t>(row.size()), std::vector<int64_t>(row.size())};
  gnnio::CsrBuildParams p;
  p.row = row.data();
  p.col = col.data();
  p.num_edges = static_cast<int64_t>(row.size());
  p.num_rows = p.num_cols = n;
  p.rowptr = c.rowptr.data();
  p.col_sorted = c.col.data();
  p.perm = c.perm.data();
  gnnio::csr_build_cpu(p);
  return c;
}

// t2c: the forward (by_dst) slot of each transposed (by_src) slot, through the edge ids.
std::vector<int64_t> forward_slot_of_transposed(const Csr& by_dst, const Csr& by_src) {
  const size_t nnz = by_dst.perm.size();
  std::vector<int64_t> slot_of_edge(nnz), t2c(nnz);
  for (size_t k = 0; k < nnz; ++k) slot_of_edge[by_dst.perm[k]] = static_cast<int64_t>(k);
  for (size_t k = 0; k < nnz; ++k) t2c[k] = slot_of_edge[by_src.perm[k]];
  return t2c;
}

TEST(SegmentReduceCpu, MaxAndMinMatchBruteForceWithEarliestTieWinner) {
  std::mt19937_64 rng(std::random_device{}());
  const int64_t n = 40, e = 300, width = 7;
  std::vector<int64_t> row(e), col(e);
  for (auto& r : row) r = rng() % n;
  for (auto& c : col) c = rng() % n;
  const Csr g = build(row, col, n);
  std::vector<float> x(n * width);
  for (auto& v : x) v = static_cast<float>(rng() % 5);  // few distinct values: many ties
  for (auto op : {gnnio::ReduceOp::kMax, gnnio::ReduceOp::kMin}) {
    std::vector<float> out(n * width);
    std::vector<int64_t> arg(n * width);
    gnnio::SegmentReduceParams p;
    p.rowptr = g.rowptr.data();
    p.col = g.col.data();
    p.x = x.data();
    p.out = out.data();
    p.arg = arg.data();
    p.op = op;
    p.num_rows = p.num_cols = n;
    p.nnz = e;
    p.width = p.x_row_stride = width;
    gnnio::segment_reduce_cpu(p);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t f = 0; f < width; ++f) {
        int64_t best = -1;  // earliest slot holding the extreme value
        for (int64_t k = g.rowptr[r]; k < g.rowptr[r + 1]; ++k) {
          const float v = x[g.col[k] * width + f];
          if (best < 0 || (op == gnnio::ReduceOp::kMax ? v > x[g.col[best] * width + f]
                                                       : v < x[g.col[best] * width + f]))
            best = k;
        }
        ASSERT_EQ(arg[r * width + f], best);
        ASSERT_EQ(out[r * width + f], best < 0 ? 0.f : x[g.col[best] * width + f]);
      }
  }
}

TEST(SegmentReduceCpu, BackwardGathersOverTheTranspose) {
  // Edges 0->2, 1->2, 0->3: node 2 takes the max of x0, x1; node 3 takes x0.
  const std::vector<int64_t> src{0, 1, 0}, dst{2, 2, 3};
  const Csr by_dst = build(dst, src, 4), by_src = build(src, dst, 4);
  const std::vector<int64_t> t2c = forward_slot_of_transposed(by_dst, by_src);
  const std::vector<double> x{1.0, 5.0, 0.0, 0.0};
  std::vector<double> out(4);
  std::vector<int64_t> arg(4);
  gnnio::SegmentReduceParams p;
  p.rowptr = by_dst.rowptr.data();
  p.col = by_dst.col.data();
  p.x = x.data();
  p.out = out.data();
  p.arg = arg.data();
  p.scalar_type = gnnio::ScalarType::kFloat64;
  p.num_rows = p.num_cols = 4;
  p.nnz = 3;
  p.width = p.x_row_stride = 1;
  gnnio::segment_reduce_cpu(p);
  EXPECT_EQ(out, (std::vector<double>{0, 0, 5, 1}));
  const std::vector<double> grad_out{10, 20, 30, 40};
  std::vector<double> grad_x(4, -1);
  gnnio::SegmentReduceBackwardParams b;
  b.rowptr_t = by_src.rowptr.data();
  b.col_t = by_src.col.data();
  b.t2c = t2c.data();
  b.arg = arg.data();
  b.grad_out = grad_out.data();
  b.grad_x = grad_x.data();
  b.scalar_type = gnnio::ScalarType::kFloat64;
  b.num_src = 4;
  b.width = 1;
  gnnio::segment_reduce_backward_cpu(b);
  EXPECT_EQ(grad_x, (std::vector<double>{40, 30, 0, 0}));
}

TEST(SegmentReduceCpu, WeightedMessagesAndBothGradients) {
  // Edges 0->2 (w 2), 1->2 (w -1), 0->3 (w 0.5), two features: node 2's candidates are
  // (2, -6) and (-4, -8) for x0 = (1, -3), x1 = (4, 8); node 3's is (0.5, -1.5).
  const std::vector<int64_t> src{0, 1, 0}, dst{2, 2, 3};
  const std::vector<double> w_edge{2.0, -1.0, 0.5};
  const Csr by_dst = build(dst, src, 4), by_src = build(src, dst, 4);
  const std::vector<int64_t> t2c = forward_slot_of_transposed(by_dst, by_src);
  std::vector<double> w(3);  // slot order
  for (int64_t k = 0; k < 3; ++k) w[k] = w_edge[by_dst.perm[k]];
  const std::vector<double> x{1.0, -3.0, 4.0, 8.0, 0.0, 0.0, 0.0, 0.0};
  std::vector<double> out(8);
  std::vector<int64_t> arg(8);
  gnnio::SegmentReduceParams p;
  p.rowptr = by_dst.rowptr.data();
  p.col = by_dst.col.data();
  p.x = x.data();
  p.weight = w.data();
  p.out = out.data();
  p.arg = arg.data();
  p.scalar_type = gnnio::ScalarType::kFloat64;
  p.num_rows = p.num_cols = 4;
  p.nnz = 3;
  p.width = p.x_row_stride = 2;
  gnnio::segment_reduce_cpu(p);
  EXPECT_EQ(out, (std::vector<double>{0, 0, 0, 0, 2, -6, 0.5, -1.5}));
  std::vector<int64_t> winner(8);  // as edge ids
  for (int64_t i = 0; i < 8; ++i) winner[i] = arg[i] < 0 ? -1 : by_dst.perm[arg[i]];
  EXPECT_EQ(winner, (std::vector<int64_t>{-1, -1, -1, -1, 0, 0, 2, 2}));

  const std::vector<double> grad_out{0, 0, 0, 0, 10, 20, 30, 40};
  std::vector<double> grad_x(8, -1);
  gnnio::SegmentReduceBackwardParams b;
  b.rowptr_t = by_src.rowptr.data();
  b.col_t = by_src.col.data();
  b.t2c = t2c.data();
  b.arg = arg.data();
  std::vector<double> w_t(3);  // transposed slot order
  for (int64_t k = 0; k < 3; ++k) w_t[k] = w[t2c[k]];
  b.weight = w_t.data();
  b.grad_out = grad_out.data();
  b.grad_x = grad_x.data();
  b.scalar_type = gnnio::ScalarType::kFloat64;
  b.num_src = 4;
  b.width = 2;
  gnnio::segment_reduce_backward_cpu(b);
  // x0 won both features of node 2 (w 2) and of node 3 (w 0.5); x1 won nothing.
  EXPECT_EQ(grad_x, (std::vector<double>{2 * 10 + 0.5 * 30, 2 * 20 + 0.5 * 40, 0, 0, 0, 0, 0, 0}));

  std::vector<double> grad_w(3, 0.0);
  gnnio::SegmentReduceWeightGradParams g;
  g.col = by_dst.col.data();
  g.arg = arg.data();
  g.x = x.data();
  g.grad_out = grad_out.data();
  g.grad_weight = grad_w.data();
  g.scalar_type = gnnio::ScalarType::kFloat64;
  g.num_rows = 4;
  g.width = g.x_row_stride = 2;
  gnnio::segment_reduce_weight_grad_cpu(g);
  std::vector<double> grad_w_edge(3);
  for (int64_t k = 0; k < 3; ++k) grad_w_edge[by_dst.perm[k]] = grad_w[k];
  EXPECT_EQ(grad_w_edge, (std::vector<double>{10 * 1 + 20 * -3, 0, 30 * 1 + 40 * -3}));
}

}  // namespace
