#include <vector>

#include "gnnio/graph/csr.h"

namespace gnnio {
namespace {

template <typename index_t>
void build(const CsrBuildParams& p) {
  const auto* row = static_cast<const index_t*>(p.row);
  const auto* col = static_cast<const index_t*>(p.col);
  auto* rowptr = static_cast<index_t*>(p.rowptr);
  auto* col_sorted = static_cast<index_t*>(p.col_sorted);
  auto* perm = static_cast<index_t*>(p.perm);

  for (int64_t r = 0; r <= p.num_rows; ++r) rowptr[r] = 0;
  for (int64_t e = 0; e < p.num_edges; ++e) {
    const int64_t r = row[e], c = col[e];
    GNNIO_CHECK(r >= 0 && r < p.num_rows, ErrorKind::kIndex, "edge ", e, ": row id ", r,
                " is out of range [0, ", p.num_rows, ")");
    GNNIO_CHECK(c >= 0 && c < p.num_cols, ErrorKind::kIndex, "edge ", e, ": column id ", c,
                " is out of range [0, ", p.num_cols, ")");
    ++rowptr[r + 1];
  }
  for (int64_t r = 0; r < p.num_rows; ++r) rowptr[r + 1] += rowptr[r];

  // Stable scatter: a row's edges keep their input order.
  std::vector<index_t> next(rowptr, rowptr + p.num_rows);
  for (int64_t e = 0; e < p.num_edges; ++e) {
    const index_t slot = next[row[e]]++;
    col_sorted[slot] = col[e];
    perm[slot] = static_cast<index_t>(e);
  }
}

}  // namespace

void csr_build_cpu(const CsrBuildParams& p) {
  GNNIO_CHECK(p.num_edges >= 0 && p.num_rows >= 0 && p.num_cols >= 0, ErrorKind::kInvalidArgument,
              "csr_build: negative size");
  dispatch_index(p.index_type, [&](auto tag) { build<decltype(tag)>(p); });
}

}  // namespace gnnio
