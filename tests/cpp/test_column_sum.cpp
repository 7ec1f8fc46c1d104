// The CPU core of column_sum against sums written here: float32 input within one rounding of the
// float64 sum of its terms (the core sums in float64), float64 input against long double, across
// slab and lane boundaries, with no rows and no columns.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gnnio/dense/column_sum.h"

namespace {

struct Shape {
  int64_t rows, cols;
};

class ColumnSumCpu : public ::testing::TestWithParam<Shape> {};

TEST_P(ColumnSumCpu, Float32WithinOneRoundingOfTheExactSum) {
  const auto [rows, cols] = GetParam();
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal;
  std::vector<float> x(rows * cols);
  for (auto& v : x) v = static_cast<float>(normal(rng));
  std::vector<float> out(cols, -1.f);
  gnnio::ColumnSumParams p;
  p.x = x.data();
  p.out = out.data();
  p.rows = rows;
  p.cols = cols;
  gnnio::column_sum_cpu(p);
  for (int64_t c = 0; c < cols; ++c) {
    long double exact = 0, magnitude = 0;
    for (int64_t r = 0; r < rows; ++r) exact += x[r * cols + c], magnitude += std::fabs(x[r * cols + c]);
    // one float32 rounding of the result, plus float64's accumulation error over `rows` terms
    const double bound = std::numeric_limits<float>::epsilon() / 2 * std::fabs(double(exact)) +
                         2 * rows * std::numeric_limits<double>::epsilon() * double(magnitude);
    EXPECT_LE(std::fabs(double(out[c]) - double(exact)), bound) << "column " << c;
  }
}

TEST_P(ColumnSumCpu, Float64AgainstLongDouble) {
  const auto [rows, cols] = GetParam();
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal;
  std::vector<double> x(rows * cols), out(cols, -1.0);
  for (auto& v : x) v = normal(rng);
  gnnio::ColumnSumParams p;
  p.x = x.data();
  p.out = out.data();
  p.scalar_type = gnnio::ScalarType::kFloat64;
  p.rows = rows;
  p.cols = cols;
  gnnio::column_sum_cpu(p);
  for (int64_t c = 0; c < cols; ++c) {
    long double exact = 0, magnitude = 0;
    for (int64_t r = 0; r < rows; ++r) exact += x[r * cols + c], magnitude += std::fabs(x[r * cols + c]);
    EXPECT_LE(std::fabs(out[c] - double(exact)),
              (rows + 1) * std::numeric_limits<double>::epsilon() * double(magnitude))
        << "column " << c;
  }
}

// A slab is at least 256 rows (column_sum_slab_rows), a lane every 8th row of it: shapes below,
// at and past those, and past the 2048-slab cap, where slabs grow instead.
INSTANTIATE_TEST_SUITE_P(Shapes, ColumnSumCpu,
                         ::testing::Values(Shape{0, 5}, Shape{7, 0}, Shape{1, 3}, Shape{9, 33},
                                           Shape{256, 4}, Shape{257, 130}, Shape{3000, 17},
                                           Shape{2048 * 256 + 5, 2}));

TEST(ColumnSum, RefusesLowPrecisionOnTheCpu) {
  std::vector<uint16_t> x(4);
  std::vector<uint16_t> out(2);
  gnnio::ColumnSumParams p;
  p.x = x.data();
  p.out = out.data();
  p.scalar_type = gnnio::ScalarType::kBFloat16;
  p.rows = 2;
  p.cols = 2;
  EXPECT_ANY_THROW(gnnio::column_sum_cpu(p));
}

}  // namespace
