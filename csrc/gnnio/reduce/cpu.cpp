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

template <typename scalar_t, typename index_t, bool kMax>
inline void update_row(const scalar_t* xr, scalar_t* y, index_t* a, index_t k, int64_t width) {
  for (int64_t f = 0; f < width; ++f) {
    const bool b = kMax ? better_max(xr[f], y[f]) : better_min(xr[f], y[f]);
    y[f] = b ? xr[f] : y[f];
    a[f] = b ? k : a[f];
  }
}

template <typename scalar_t, typename index_t>
void forward(const SegmentReduceParams& p) {
  const auto* rowptr = static_cast<const index_t*>(p.rowptr);
  const auto* col = static_cast<const index_t*>(p.col);
  const auto* x = static_cast<const scalar_t*>(p.x);
  auto* out = static_cast<scalar_t*>(p.out);
  auto* arg = static_cast<index_t*>(p.arg);
  const int64_t width = p.width;

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
    for (int64_t f = 0; f < width; ++f) y[f] = first[f], a[f] = static_cast<index_t>(begin);
    for (int64_t k = begin + 1; k < end; ++k) {
      const scalar_t* xr = x + int64_t(col[k]) * p.x_row_stride;
      if (p.op == ReduceOp::kMax)
        update_row<scalar_t, index_t, true>(xr, y, a, static_cast<index_t>(k), width);
      else
        update_row<scalar_t, index_t, false>(xr, y, a, static_cast<index_t>(k), width);
    }
  }
}

template <typename scalar_t, typename index_t>
void backward(const SegmentReduceBackwardParams& p) {
  const auto* rowptr_t = static_cast<const index_t*>(p.rowptr_t);
  const auto* col_t = static_cast<const index_t*>(p.col_t);
  const auto* t2c = static_cast<const index_t*>(p.t2c);
  const auto* arg = static_cast<const index_t*>(p.arg);
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
      for (int64_t f = 0; f < width; ++f) out[f] += a[f] == slot ? gr[f] : scalar_t(0);
    }
  }
}

}  // namespace

void segment_reduce_cpu(const SegmentReduceParams& p) {
  dispatch_cpu(p.scalar_type, p.index_type, "segment_reduce", [&](auto scalar, auto index) {
    forward<decltype(scalar), decltype(index)>(p);
  });
}

void segment_reduce_backward_cpu(const SegmentReduceBackwardParams& p) {
  dispatch_cpu(p.scalar_type, p.index_type, "segment_reduce backward", [&](auto scalar, auto index) {
    backward<decltype(scalar), decltype(index)>(p);
  });
}

}  // namespace gnnio
