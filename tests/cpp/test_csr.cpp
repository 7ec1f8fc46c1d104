#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "gnnio/graph/csr.h"

namespace {

template <typename index_t>
struct Csr {
  std::vector<index_t> rowptr, col, perm;
};

template <typename index_t>
Csr<index_t> build(const std::vector<index_t>& row, const std::vector<index_t>& col,
                   int64_t num_rows, int64_t num_cols) {
  Csr<index_t> out;
  out.rowptr.resize(num_rows + 1);
  out.col.resize(row.size());
  out.perm.resize(row.size());
  gnnio::CsrBuildParams p;
  p.row = row.data();
  p.col = col.data();
  p.num_edges = static_cast<int64_t>(row.size());
  p.num_rows = num_rows;
  p.num_cols = num_cols;
  p.index_type = sizeof(index_t) == 4 ? gnnio::IndexType::kInt32 : gnnio::IndexType::kInt64;
  p.rowptr = out.rowptr.data();
  p.col_sorted = out.col.data();
  p.perm = out.perm.data();
  gnnio::csr_build_cpu(p);
  return out;
}

// Brute force: for each row, the edges with that row id in input order.
template <typename index_t>
void expect_matches_brute_force(const std::vector<index_t>& row, const std::vector<index_t>& col,
                                int64_t num_rows, const Csr<index_t>& csr) {
  int64_t slot = 0;
  for (int64_t r = 0; r < num_rows; ++r) {
    ASSERT_EQ(csr.rowptr[r], slot) << "row " << r;
    for (size_t e = 0; e < row.size(); ++e) {
      if (row[e] != r) continue;
      ASSERT_EQ(csr.perm[slot], static_cast<index_t>(e));
      ASSERT_EQ(csr.col[slot], col[e]);
      ++slot;
    }
  }
  ASSERT_EQ(csr.rowptr[num_rows], slot);
  ASSERT_EQ(slot, static_cast<int64_t>(row.size()));
}

template <typename T>
class CsrBuild : public ::testing::Test {};
using IndexTypes = ::testing::Types<int32_t, int64_t>;
TYPED_TEST_SUITE(CsrBuild, IndexTypes);

TYPED_TEST(CsrBuild, RandomGraphsMatchBruteForce) {
  std::mt19937_64 rng(std::random_device{}());
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t num_rows = 1 + rng() % 50, num_cols = 1 + rng() % 50, num_edges = rng() % 400;
    std::vector<TypeParam> row(num_edges), col(num_edges);
    for (auto& r : row) r = static_cast<TypeParam>(rng() % num_rows);
    for (auto& c : col) c = static_cast<TypeParam>(rng() % num_cols);
    expect_matches_brute_force(row, col, num_rows, build(row, col, num_rows, num_cols));
  }
}

TYPED_TEST(CsrBuild, EmptyGraphAndIsolatedNodes) {
  const std::vector<TypeParam> none;
  auto empty = build(none, none, 0, 0);
  EXPECT_EQ(empty.rowptr, std::vector<TypeParam>{0});
  auto isolated = build(none, none, 4, 4);
  EXPECT_EQ(isolated.rowptr, std::vector<TypeParam>(5, 0));
}

TYPED_TEST(CsrBuild, HubDuplicatesAndSelfLoops) {
  std::vector<TypeParam> row, col;
  for (int i = 0; i < 100000; ++i) row.push_back(3), col.push_back(static_cast<TypeParam>(i % 7));
  row.push_back(5), col.push_back(5);  // self loop
  row.push_back(5), col.push_back(5);  // duplicate
  expect_matches_brute_force(row, col, 8, build(row, col, 8, 8));
}

TEST(CsrBuildErrors, OutOfRangeIdsThrowIndexError) {
  const std::vector<int64_t> row{0, 3}, col{1, 1};
  try {
    build(row, col, 3, 3);
    FAIL() << "expected an exception";
  } catch (const gnnio::Error& e) {
    EXPECT_EQ(e.kind(), gnnio::ErrorKind::kIndex);
    EXPECT_NE(std::string(e.what()).find("row id 3"), std::string::npos) << e.what();
  }
  const std::vector<int64_t> neg_col{0, -1};
  EXPECT_THROW(build(std::vector<int64_t>{0, 1}, neg_col, 3, 3), gnnio::Error);
}

}  // namespace
