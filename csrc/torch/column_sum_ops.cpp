// CPU implementation of gnnio::column_sum (gnnio/dense/column_sum.h); its autograd (d x = the
// gradient broadcast over the rows) is registered from Python (gnnio/_ops.py).
#include "column_sum_common.h"

namespace gnnio::binding {
namespace {

at::Tensor column_sum_cpu_impl(const at::Tensor& x_in) {
  const at::Tensor x = x_in.contiguous();
  at::Tensor out;
  const auto p = column_sum_params(x, out);
  translate_errors([&] { column_sum_cpu(p); });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, CPU, m) { m.impl("column_sum", &column_sum_cpu_impl); }

}  // namespace gnnio::binding
