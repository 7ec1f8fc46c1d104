// Column sums on the CPU (column_sum.h): the CUDA kernel's slabs, lanes and order, one thread per
// slab, so that both give the same bits.
#include <vector>

#include "gnnio/common/cpu_dispatch.h"
#include "gnnio/dense/column_sum.h"

namespace gnnio {

void column_sum_cpu(const ColumnSumParams& p) {
  GNNIO_CHECK(p.rows >= 0 && p.cols >= 0, ErrorKind::kInvalidArgument, "column_sum: negative size");
  GNNIO_CHECK(p.x || p.rows * p.cols == 0, ErrorKind::kInvalidArgument, "column_sum: x is required");
  GNNIO_CHECK(p.out || p.cols == 0, ErrorKind::kInvalidArgument, "column_sum: out is required");
  const int64_t slab = column_sum_slab_rows(p.rows), slabs = column_sum_slabs(p.rows);
  dispatch_cpu(p.scalar_type, IndexType::kInt64, "column_sum", [&](auto scalar, auto) {
    using T = decltype(scalar);
    const auto* x = static_cast<const T*>(p.x);
    constexpr int64_t kLanes = kColumnSumLanes;
    std::vector<double> partial(static_cast<size_t>(slabs * p.cols), 0.0);
#pragma omp parallel for schedule(static) if (worth_threads(p.rows * p.cols))
    for (int64_t s = 0; s < slabs; ++s) {
      std::vector<double> lanes(static_cast<size_t>(kLanes * p.cols), 0.0);
      const int64_t begin = s * slab, end = begin + slab < p.rows ? begin + slab : p.rows;
      for (int64_t r = begin; r < end; ++r) {
        double* acc = lanes.data() + ((r - begin) % kLanes) * p.cols;
        for (int64_t c = 0; c < p.cols; ++c) acc[c] += static_cast<double>(x[r * p.cols + c]);
      }
      double* out = partial.data() + s * p.cols;
      for (int64_t w = 0; w < kLanes; ++w)
        for (int64_t c = 0; c < p.cols; ++c) out[c] += lanes[w * p.cols + c];
    }
    auto* out = static_cast<T*>(p.out);
    constexpr int64_t kFinish = kColumnSumFinishLanes;
    for (int64_t c = 0; c < p.cols; ++c) {
      double lane[kFinish] = {};
      for (int64_t s = 0; s < slabs; ++s) lane[s % kFinish] += partial[s * p.cols + c];
      for (int64_t half = kFinish / 2; half > 0; half /= 2)
        for (int64_t j = 0; j < half; ++j) lane[j] += lane[j + half];
      out[c] = static_cast<T>(lane[0]);
    }
  });
}

}  // namespace gnnio
