// CPU implementations of the graph-format ops.
#include <cstring>

#include "graph_common.h"
#include "gnnio/graph/mtx.h"

namespace gnnio::binding {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor> csr_from_coo_cpu(const at::Tensor& row,
                                                                const at::Tensor& col,
                                                                int64_t num_rows,
                                                                int64_t num_cols) {
  CsrBuildTensors t = prepare_csr_build(row, col, num_rows, num_cols);
  translate_errors([&] { csr_build_cpu(t.params); });
  return {t.rowptr, t.col_sorted, t.perm};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, int64_t, int64_t, bool> parse_mtx_cpu(
    const at::Tensor& text) {
  TORCH_CHECK_VALUE(text.scalar_type() == at::kByte && text.dim() == 1,
                    "text must be a 1-D uint8 tensor");
  const auto t = text.contiguous();
  MtxGraph g = translate_errors([&] {
    return parse_mtx(reinterpret_cast<const char*>(t.data_ptr<uint8_t>()), t.numel());
  });
  const auto n = static_cast<int64_t>(g.row.size());
  auto row = at::empty({n}, at::kLong), col = at::empty({n}, at::kLong);
  std::memcpy(row.data_ptr<int64_t>(), g.row.data(), n * sizeof(int64_t));
  std::memcpy(col.data_ptr<int64_t>(), g.col.data(), n * sizeof(int64_t));
  auto value = at::empty({static_cast<int64_t>(g.value.size())}, at::kDouble);
  if (!g.value.empty())
    std::memcpy(value.data_ptr<double>(), g.value.data(), g.value.size() * sizeof(double));
  return {row, col, value, g.num_rows, g.num_cols, g.symmetric};
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, CPU, m) {
  m.impl("csr_from_coo", &csr_from_coo_cpu);
  m.impl("parse_mtx", &parse_mtx_cpu);
}

}  // namespace gnnio::binding
