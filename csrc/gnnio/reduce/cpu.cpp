#include <cmath>
#include <vector>

#include "gnnio/common/cpu_dispatch.h"
#include "gnnio/reduce/params.h"

namespace gnnio {
namespace {

// True when v should replace best for this reduction (NaN wins; ties keep the earlier slot).
// Branch-free (v != v is NaN) so the feature loop vectorises.
template <typename T>
inline bool better_max(T v, T best) { return (v > best) | ((v != v) & (best == best)); }
template <typename T>
inline bool better_min(T v, T best) { return (v < best) | ((v != v) & (best == best)); }

// The candidate of slot k at feature f: x itself, or PyG's message w * x rounded once.
template <typename scalar_t, bool kWeighted>
inline scalar_t candidate(const scalar_t* xr, scalar_t w, int64_t f) {
  return kWeighted ? w * xr[f] : xr[f];
}

template <typename scalar_t, typename index_t, bool kMax, bool kWeighted>
inline void update_row(const scalar_t* xr, scalar_t w, scalar_t* y, index_t* a, index_t k,
                       int64_t width) {
  for (int64_t f = 0; f < width; ++f) {
    const scalar_t v = candidate<scalar_t, kWeighted>(xr, w, f);
    const bool b = kMax ? better_max(v, y[f]) : better_min(v, y[f]);
    y[f] = b ? v : y[f];
    a[f] = b ? k : a[f];
  }
}

template <typename scalar_t, typename index_t, bool kMax, bool kWeighted>
void forward(const SegmentReduceParams& p) {
  const auto* rowptr = static_cast<const index_t*>(p.rowptr);
  const auto* col = static_cast<const index_t*>(p.col);
  const auto* x = static_cast<const scalar_t*>(p.x);
  const auto* weight = static_cast<const scalar_t*>(p.weight);
  auto* out = static_cast<scalar_t*>(p.out);
  auto* arg = static_cast<index_t*>(p.arg);
  const int64_t width = p.width;
  auto w_of = [&](int64_t k) { return kWeighted ? weight[k] : scalar_t(1); };

#pragma omp parallel for schedule(dynamic, 64) if (worth_threads(p.nnz * width))
  for (int64_t r = 0; r < p.num_rows; ++r) {
    scalar_t* y = out + r * width;
    index_t* a = arg + r * width;
    const int64_t begin = rowptr[r], end = rowptr[r + 1];
    if (begin == end) {
      for (int64_t f = 0; f < width; ++f) y[f] = scalar_t(0), a[f] = index_t(-1);
      continue;
    }
    const scalar_t* first = x + int64_t(col[begin]) * p.x_row_stride;
    const scalar_t w_first = w_of(begin);
    for (int64_t f = 0; f < width; ++f)
      y[f] = candidate<scalar_t, kWeighted>(first, w_first, f), a[f] = static_cast<index_t>(begin);
    for (int64_t k = begin + 1; k < end; ++k) {
      const scalar_t* xr = x + int64_t(col[k]) * p.x_row_stride;
      update_row<scalar_t, index_t, kMax, kWeighted>(xr, w_of(k), y, a, static_cast<index_t>(k), width);
    }
  }
}

template <typename scalar_t, typename index_t>
void backward(const SegmentReduceBackwardParams& p) {
  const auto* rowptr_t = static_cast<const index_t*>(p.rowptr_t);
  const auto* col_t = static_cast<const index_t*>(p.col_t);
  const auto* t2c = static_cast<const index_t*>(p.t2c);
  const auto* arg = static_cast<const index_t*>(p.arg);
  const auto* weight = static_cast<const scalar_t*>(p.weight);
  const auto* g = static_cast<const scalar_t*>(p.grad_out);
  auto* gx = static_cast<scalar_t*>(p.grad_x);
  const int64_t width = p.width;
  const int64_t nnz = p.num_src > 0 ? int64_t(rowptr_t[p.num_src]) : 0;

#pragma omp parallel for schedule(dynamic, 64) if (worth_threads(nnz * width))
  for (int64_t j = 0; j < p.num_src; ++j) {
    scalar_t* out = gx + j * width;
    for (int64_t f = 0; f < width; ++f) out[f] = scalar_t(0);
    for (int64_t k = rowptr_t[j]; k < rowptr_t[j + 1]; ++k) {
      const int64_t r = col_t[k];
      const index_t slot = t2c[k];
      const index_t* a = arg + r * width;
      const scalar_t* gr = g + r * width;
      if (weight == nullptr) {
        for (int64_t f = 0; f < width; ++f) out[f] += a[f] == slot ? gr[f] : scalar_t(0);
      } else {
        const scalar_t w = weight[k];
        for (int64_t f = 0; f < width; ++f) out[f] += a[f] == slot ? w * gr[f] : scalar_t(0);
      }
    }
  }
}

template <typename scalar_t, typename index_t>
void weight_grad(const SegmentReduceWeightGradParams& p) {
  const auto* col = static_cast<const index_t*>(p.col);
  const auto* arg = static_cast<const index_t*>(p.arg);
  const auto* x = static_cast<const scalar_t*>(p.x);
  const auto* g = static_cast<const scalar_t*>(p.grad_out);
  auto* gw = static_cast<scalar_t*>(p.grad_weight);  // zero on entry; float32 / float64 accumulate in themselves
  const int64_t width = p.width;

#pragma omp parallel for schedule(dynamic, 64) if (worth_threads(p.num_rows * width))
  for (int64_t r = 0; r < p.num_rows; ++r) {
    const index_t* a = arg + r * width;
    const scalar_t* gr = g + r * width;
    for (int64_t f = 0; f < width; ++f) {
      const int64_t k = a[f];
      if (k < 0) continue;
      const scalar_t product = gr[f] * x[int64_t(col[k]) * p.x_row_stride + f];
      gw[k] += product;
    }
  }
}

}  // namespace

void segment_reduce_cpu(const SegmentReduceParams& p) {
  dispatch_cpu(p.scalar_type, p.index_type, "segment_reduce", [&](auto scalar, auto index) {
    using scalar_t = decltype(scalar);
    using index_t = decltype(index);
    const bool max = p.op == ReduceOp::kMax, weighted = p.weight != nullptr;
    if (max && weighted) forward<scalar_t, index_t, true, true>(p);
    else if (max) forward<scalar_t, index_t, true, false>(p);
    else if (weighted) forward<scalar_t, index_t, false, true>(p);
    else forward<scalar_t, index_t, false, false>(p);
  });
}

void segment_reduce_backward_cpu(const SegmentReduceBackwardParams& p) {
  dispatch_cpu(p.scalar_type, p.index_type, "segment_reduce backward", [&](auto scalar, auto index) {
    backward<decltype(scalar), decltype(index)>(p);
  });
}

void segment_reduce_weight_grad_cpu(const SegmentReduceWeightGradParams& p) {
  dispatch_cpu(p.scalar_type, p.index_type, "segment_reduce weight gradient", [&](auto scalar, auto index) {
    weight_grad<decltype(scalar), decltype(index)>(p);
  });
}

}  // namespace gnnio
