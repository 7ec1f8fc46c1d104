// Shared by the CPU and CUDA bindings of gnnio::column_sum: checks and the params struct.
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include "common.h"
#include "gnnio/dense/column_sum.h"

namespace gnnio::binding {

// x: [rows, cols] floating point, contiguous (the caller's .contiguous(), alive while the kernel
// runs); out: [cols] in x's dtype, allocated here.
inline ColumnSumParams column_sum_params(const at::Tensor& x, at::Tensor& out) {
  TORCH_CHECK_VALUE(x.dim() == 2, "column_sum: x must be 2-D [rows, cols], got ",
                    sizes_text(x.sizes()));
  TORCH_INTERNAL_ASSERT(x.is_contiguous());
  ColumnSumParams p;
  p.scalar_type = scalar_type_of(x, "column_sum: x");
  p.rows = x.size(0);
  p.cols = x.size(1);
  out = at::empty({p.cols}, x.options());
  p.x = x.data_ptr();
  p.out = out.data_ptr();
  return p;
}

// gnnio::column_sum of a [rows, ...] tensor's rows through the dispatcher (the kernel of x's
// device): [prod(other sizes)] in x's dtype.
inline at::Tensor column_sum_of_rows(const at::Tensor& x) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("gnnio::column_sum", "")
                       .typed<at::Tensor(const at::Tensor&)>();
  // flatten, not reshape({rows, -1}): a [0, H, C] gradient (a graph of no nodes) has no -1.
  return op.call(x.dim() > 1 ? x.flatten(1) : x.reshape({x.size(0), 1}));
}

}  // namespace gnnio::binding
