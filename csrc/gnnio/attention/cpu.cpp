#include <cmath>
#include <limits>
#include <vector>

#include "gnnio/attention/params.h"
#include "gnnio/common/cpu_dispatch.h"

namespace gnnio {
namespace {

constexpr double kSoftmaxEps = 1e-16;  // PyG's softmax denominator guard

template <typename T>
inline T leaky(T v, T slope) { return v > T(0) ? v : v * slope; }

template <typename T>
struct Inputs {
  const T* alpha_src;
  const T* alpha_dst;
  const T* h;
  int64_t H, C;
  T slope;
  T raw(int64_t i, int64_t j, int64_t hd) const {
    return alpha_src[j * H + hd] + (alpha_dst ? alpha_dst[i * H + hd] : T(0));
  }
  const T* row(int64_t j, int64_t hd) const { return h + (j * H + hd) * C; }
};

template <typename T>
Inputs<T> inputs(const GatParams& p) {
  return {static_cast<const T*>(p.alpha_src), static_cast<const T*>(p.alpha_dst),
          static_cast<const T*>(p.h_src), p.heads, p.channels, static_cast<T>(p.negative_slope)};
}

template <typename T, typename index_t>
void forward(const GatParams& p) {
  const auto* rowptr = static_cast<const index_t*>(p.rowptr);
  const auto* col = static_cast<const index_t*>(p.col);
  const Inputs<T> in = inputs<T>(p);
  auto* out = static_cast<T*>(p.out);
  auto* stats = static_cast<T*>(p.stats);
  const int64_t H = p.heads, C = p.channels;
  const int64_t nnz = p.num_dst > 0 ? int64_t(rowptr[p.num_dst]) : 0;

  // The CPU path is the reference implementation: it accumulates in double, so the online
  // rescaling adds no error beyond the float32 inputs and outputs.
#pragma omp parallel for schedule(dynamic, 16) if (worth_threads(nnz * H * C))
  for (int64_t i = 0; i < p.num_dst; ++i) {
    std::vector<double> acc(C);
    for (int64_t hd = 0; hd < H; ++hd) {
      T m = -std::numeric_limits<T>::infinity();
      double s = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t k = rowptr[i]; k < rowptr[i + 1]; ++k) {
        const int64_t j = col[k];
        const T e = leaky(in.raw(i, j, hd), in.slope);
        if (e > m) {  // new running max: rescale what was summed so far
          const double scale = std::exp(double(m) - double(e));
          s *= scale;
          for (auto& a : acc) a *= scale;
          m = e;
        }
        const double w = std::exp(double(e) - double(m));
        s += w;
        const T* hj = in.row(j, hd);
        for (int64_t c = 0; c < C; ++c) acc[c] += w * double(hj[c]);
      }
      T* o = out + (i * H + hd) * C;
      const double denom = s + kSoftmaxEps;
      for (int64_t c = 0; c < C; ++c) o[c] = static_cast<T>(acc[c] / denom);
      const bool empty = rowptr[i] == rowptr[i + 1];
      stats[(i * H + hd) * 2] = empty ? T(0) : m;
      stats[(i * H + hd) * 2 + 1] = static_cast<T>(denom);
    }
  }
}

template <typename T, typename index_t>
void backward(const GatBackwardParams& b) {
  const GatParams& p = b.fwd;
  const auto* rowptr = static_cast<const index_t*>(p.rowptr);
  const auto* col = static_cast<const index_t*>(p.col);
  const auto* rowptr_t = static_cast<const index_t*>(b.rowptr_t);
  const auto* col_t = static_cast<const index_t*>(b.col_t);
  const Inputs<T> in = inputs<T>(p);
  const auto* out = static_cast<const T*>(p.out);
  const auto* stats = static_cast<const T*>(p.stats);
  const auto* g = static_cast<const T*>(b.grad_out);
  auto* delta = static_cast<double*>(b.delta);
  auto* d_h = static_cast<T*>(b.grad_h_src);
  auto* d_as = static_cast<T*>(b.grad_alpha_src);
  auto* d_ad = static_cast<T*>(b.grad_alpha_dst);
  const int64_t H = p.heads, C = p.channels;
  const int64_t nnz = p.num_dst > 0 ? int64_t(rowptr[p.num_dst]) : 0;
  const bool threads = worth_threads(nnz * H * C);

  // Like the forward, the backward accumulates in double (the CPU path is the reference).
  auto dot = [C](const T* a, const T* c) {
    double s = 0;
    for (int64_t k = 0; k < C; ++k) s += double(a[k]) * double(c[k]);
    return s;
  };
  // d e_ij (through the softmax and the LeakyReLU) and p_ij, recomputed from (max, sum).
  auto edge_grads = [&](int64_t i, int64_t j, int64_t hd, double& prob) {
    const T raw = in.raw(i, j, hd);
    const T* st = stats + (i * H + hd) * 2;
    prob = std::exp(double(leaky(raw, in.slope)) - double(st[0])) / double(st[1]);
    const double dp = dot(g + (i * H + hd) * C, in.row(j, hd));
    return prob * (dp - delta[i * H + hd]) * (raw > T(0) ? 1.0 : double(in.slope));
  };

  // Pass A, per destination: D_i, then d alpha_dst.
#pragma omp parallel for schedule(dynamic, 16) if (threads)
  for (int64_t i = 0; i < p.num_dst; ++i)
    for (int64_t hd = 0; hd < H; ++hd) {
      delta[i * H + hd] = dot(g + (i * H + hd) * C, out + (i * H + hd) * C);
      if (!d_ad) continue;
      double acc = 0, prob = 0;
      for (int64_t k = rowptr[i]; k < rowptr[i + 1]; ++k) acc += edge_grads(i, col[k], hd, prob);
      d_ad[i * H + hd] = static_cast<T>(acc);
    }

  // Pass B, per source: d h_src and d alpha_src.
#pragma omp parallel for schedule(dynamic, 16) if (threads)
  for (int64_t j = 0; j < p.num_src; ++j) {
    std::vector<double> dh(C);
    for (int64_t hd = 0; hd < H; ++hd) {
      std::fill(dh.begin(), dh.end(), 0.0);
      double acc = 0, prob = 0;
      for (int64_t k = rowptr_t[j]; k < rowptr_t[j + 1]; ++k) {
        const int64_t i = col_t[k];
        acc += edge_grads(i, j, hd, prob);
        const T* gi = g + (i * H + hd) * C;
        for (int64_t c = 0; c < C; ++c) dh[c] += prob * double(gi[c]);
      }
      T* out_dh = d_h + (j * H + hd) * C;
      for (int64_t c = 0; c < C; ++c) out_dh[c] = static_cast<T>(dh[c]);
      d_as[j * H + hd] = static_cast<T>(acc);
    }
  }
}

}  // namespace

void gat_forward_cpu(const GatParams& p) {
  dispatch_cpu(p.scalar_type, p.index_type, "gat", [&](auto scalar, auto index) {
    forward<decltype(scalar), decltype(index)>(p);
  });
}

void gat_backward_cpu(const GatBackwardParams& b) {
  dispatch_cpu(b.fwd.scalar_type, b.fwd.index_type, "gat backward", [&](auto scalar, auto index) {
    backward<decltype(scalar), decltype(index)>(b);
  });
}

}  // namespace gnnio
