// The CPU core of the fused GAT scores against a float64 computation in the test: forward,
// d x, and d att from the per-chunk partials (added here in chunk order, as the binding does).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <stdexcept>
#include <vector>

#include "gnnio/attention/head_scores.h"

namespace {

struct Shape {
  int64_t rows, atts, heads, channels;
};

class HeadScoresCpu : public ::testing::TestWithParam<Shape> {};

// The backward's params for x [N, H, C], att [A, H, C] and the score gradient g [A, N, H];
// grad_x and att_partials are the caller's.
gnnio::HeadScoresBackwardParams backward_params(const std::vector<float>& x, const std::vector<float>& att,
                                                const std::vector<float>& g, const Shape& s) {
  gnnio::HeadScoresBackwardParams b;
  b.x = x.data();
  b.att = att.data();
  b.grad_score = g.data();
  b.num_rows = s.rows;
  b.num_att = s.atts;
  b.heads = s.heads;
  b.channels = s.channels;
  return b;
}

TEST_P(HeadScoresCpu, ForwardAndBackwardMatchFloat64) {
  const Shape s = GetParam();
  const int64_t N = s.rows, A = s.atts, H = s.heads, C = s.channels, HC = H * C;
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal;
  std::vector<float> x(N * HC), att(A * HC), g(N * A * H);
  for (auto& v : x) v = static_cast<float>(normal(rng));
  for (auto& v : att) v = static_cast<float>(normal(rng));
  for (auto& v : g) v = static_cast<float>(normal(rng));

  std::vector<float> score(N * A * H, -1.f);
  gnnio::HeadScoresParams p;
  p.x = x.data();
  p.att = att.data();
  p.score = score.data();
  p.num_rows = N;
  p.num_att = A;
  p.heads = H;
  p.channels = C;
  gnnio::head_scores_cpu(p);

  const int64_t chunks = gnnio::head_score_chunks(N);
  std::vector<float> grad_x(N * HC, -1.f), partials(chunks * A * HC, -1.f);
  gnnio::HeadScoresBackwardParams b = backward_params(x, att, g, s);
  b.grad_x = grad_x.data();
  b.att_partials = partials.data();
  gnnio::head_scores_backward_cpu(b);

  // Error bounds of a float32 sum of k products: k * 2^-24 * sum |terms| (plus one rounding).
  const double u = std::ldexp(1.0, -24);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t a = 0; a < A; ++a)
      for (int64_t h = 0; h < H; ++h) {
        double ref = 0, mag = 0;
        for (int64_t c = 0; c < C; ++c) {
          const double t = double(x[(n * H + h) * C + c]) * att[(a * H + h) * C + c];
          ref += t;
          mag += std::fabs(t);
        }
        EXPECT_NEAR(score[(a * N + n) * H + h], ref, (C + 1) * u * mag + 1e-30);
      }
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < HC; ++j) {
      double ref = 0, mag = 0;
      for (int64_t a = 0; a < A; ++a) {
        const double t = double(g[(a * N + n) * H + j / C]) * att[a * HC + j];
        ref += t;
        mag += std::fabs(t);
      }
      EXPECT_NEAR(grad_x[n * HC + j], ref, (A + 1) * u * mag + 1e-30);
    }
  for (int64_t a = 0; a < A; ++a)
    for (int64_t j = 0; j < HC; ++j) {
      double ref = 0, mag = 0, sum = 0;
      for (int64_t n = 0; n < N; ++n) {
        const double t = double(g[(a * N + n) * H + j / C]) * x[n * HC + j];
        ref += t;
        mag += std::fabs(t);
      }
      for (int64_t k = 0; k < chunks; ++k) sum += partials[(k * A + a) * HC + j];
      EXPECT_NEAR(sum, ref, (gnnio::kHeadScoreChunkRows + 1) * u * mag + 1e-30);
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, HeadScoresCpu,
                         ::testing::Values(Shape{1, 1, 1, 1}, Shape{130, 2, 4, 32}, Shape{64, 1, 3, 7},
                                           Shape{200, 2, 8, 8}, Shape{65, 4, 2, 5}, Shape{0, 2, 4, 8},
                                           Shape{70, 2, 4, 0}));

// grad_x_accumulate: d x is added into what grad_x holds, the same float as a sum afterwards.
TEST(HeadScoresCpuAccumulate, AddsIntoGradX) {
  const int64_t N = 130, A = 2, H = 4, C = 8, HC = H * C;
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal;
  std::vector<float> x(N * HC), att(A * HC), g(N * A * H), other(N * HC);
  for (auto* v : {&x, &att, &g, &other})
    for (auto& e : *v) e = static_cast<float>(normal(rng));
  gnnio::HeadScoresBackwardParams b = backward_params(x, att, g, Shape{N, A, H, C});
  std::vector<float> alone(N * HC), into = other;
  b.grad_x = alone.data();
  gnnio::head_scores_backward_cpu(b);
  b.grad_x = into.data();
  b.grad_x_accumulate = true;
  gnnio::head_scores_backward_cpu(b);
  for (int64_t i = 0; i < N * HC; ++i) EXPECT_EQ(into[i], other[i] + alone[i]) << i;
}

TEST(HeadScoresCpuErrors, RefusesHalfTypes) {
  gnnio::HeadScoresParams p;
  p.scalar_type = gnnio::ScalarType::kBFloat16;
  EXPECT_THROW(gnnio::head_scores_cpu(p), std::exception);
}

}  // namespace
