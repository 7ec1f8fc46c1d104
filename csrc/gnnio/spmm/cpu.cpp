#include <algorithm>

#include "gnnio/common/cpu_dispatch.h"
#include "gnnio/spmm/params.h"

namespace gnnio {
namespace {

template <typename scalar_t, typename index_t>
void spmm(const SpmmParams& p) {
  const auto* rowptr = static_cast<const index_t*>(p.rowptr);
  const auto* col = static_cast<const index_t*>(p.col);
  const auto* value = static_cast<const scalar_t*>(p.value);
  const auto* x = static_cast<const scalar_t*>(p.x);
  auto* out = static_cast<scalar_t*>(p.out);
  const int64_t width = p.width;

#pragma omp parallel for schedule(dynamic, 64) if (worth_threads(p.nnz * width))
  for (int64_t r = 0; r < p.num_rows; ++r) {
    scalar_t* y = out + r * p.out_row_stride;
    std::fill(y, y + width, scalar_t(0));
    for (int64_t k = rowptr[r]; k < rowptr[r + 1]; ++k) {
      const scalar_t* xr = x + int64_t(col[k]) * p.x_row_stride;
      const scalar_t w = value ? value[k] : scalar_t(1);
      for (int64_t f = 0; f < width; ++f) y[f] += w * xr[f];
    }
  }
}

template <typename scalar_t, typename index_t>
void sddmm(const SddmmParams& p) {
  const auto* rowptr = static_cast<const index_t*>(p.rowptr);
  const auto* col = static_cast<const index_t*>(p.col);
  const auto* a = static_cast<const scalar_t*>(p.a);
  const auto* b = static_cast<const scalar_t*>(p.b);
  auto* out = static_cast<scalar_t*>(p.out);

#pragma omp parallel for schedule(dynamic, 64) if (worth_threads(p.nnz * p.width))
  for (int64_t r = 0; r < p.num_rows; ++r) {
    const scalar_t* ar = a + r * p.a_row_stride;
    for (int64_t k = rowptr[r]; k < rowptr[r + 1]; ++k) {
      const scalar_t* br = b + int64_t(col[k]) * p.b_row_stride;
      // A dot product over all features: accumulate in double so its error does not grow
      // with the width (PyG's pairwise sum grows like log F; a float32 running sum like F).
      double acc = 0;
      for (int64_t f = 0; f < p.width; ++f) acc += double(ar[f]) * double(br[f]);
      out[k] = static_cast<scalar_t>(acc);
    }
  }
}

}  // namespace

void spmm_cpu(const SpmmParams& p) {
  dispatch_cpu(p.scalar_type, p.index_type, "spmm", [&](auto scalar, auto index) {
    spmm<decltype(scalar), decltype(index)>(p);
  });
}

void sddmm_cpu(const SddmmParams& p) {
  dispatch_cpu(p.scalar_type, p.index_type, "sddmm", [&](auto scalar, auto index) {
    sddmm<decltype(scalar), decltype(index)>(p);
  });
}

}  // namespace gnnio
