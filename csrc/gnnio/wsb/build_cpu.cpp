#include <algorithm>
#include <vector>

#include "gnnio/common/cpu_dispatch.h"
#include "gnnio/wsb/params.h"

namespace gnnio {
namespace {

// The edges of each block row, grouped by a counting sort (edge ids, in input order).
struct BlockRows {
  std::vector<int64_t> start;  // [num_block_rows + 1]
  std::vector<int64_t> edges;  // [num_edges]
};

template <typename index_t>
BlockRows group_by_block_row(const WsbBuildParams& p) {
  const auto* row = static_cast<const index_t*>(p.row);
  const auto* col = static_cast<const index_t*>(p.col);
  const int64_t nbr = wsb_blocks(p.num_rows);
  BlockRows g{std::vector<int64_t>(nbr + 1, 0), std::vector<int64_t>(p.num_edges)};
  for (int64_t e = 0; e < p.num_edges; ++e) {
    const int64_t r = row[e], c = col[e];
    GNNIO_CHECK(r >= 0 && r < p.num_rows, ErrorKind::kIndex, "edge ", e, ": row id ", r,
                " is out of range [0, ", p.num_rows, ")");
    GNNIO_CHECK(c >= 0 && c < p.num_cols, ErrorKind::kIndex, "edge ", e, ": column id ", c,
                " is out of range [0, ", p.num_cols, ")");
    ++g.start[r / kWsbTile + 1];
  }
  for (int64_t b = 0; b < nbr; ++b) g.start[b + 1] += g.start[b];
  std::vector<int64_t> next(g.start.begin(), g.start.end() - 1);
  for (int64_t e = 0; e < p.num_edges; ++e) g.edges[next[row[e] / kWsbTile]++] = e;
  return g;
}

// The sorted distinct block columns of block row b, into `cols` (reused across rows).
template <typename index_t>
void block_columns(const WsbBuildParams& p, const BlockRows& g, int64_t b,
                   std::vector<int64_t>& cols) {
  const auto* col = static_cast<const index_t*>(p.col);
  cols.clear();
  for (int64_t k = g.start[b]; k < g.start[b + 1]; ++k) cols.push_back(col[g.edges[k]] / kWsbTile);
  std::sort(cols.begin(), cols.end());
  cols.erase(std::unique(cols.begin(), cols.end()), cols.end());
}

template <typename index_t>
int64_t count_tiles(const WsbBuildParams& p) {
  const BlockRows g = group_by_block_row<index_t>(p);
  const int64_t nbr = wsb_blocks(p.num_rows);
  auto* block_rowptr = static_cast<index_t*>(p.block_rowptr);
  block_rowptr[0] = 0;
#pragma omp parallel if (worth_threads(p.num_edges))
  {
    std::vector<int64_t> cols;
#pragma omp for schedule(dynamic, 256)
    for (int64_t b = 0; b < nbr; ++b) {
      block_columns<index_t>(p, g, b, cols);
      block_rowptr[b + 1] = static_cast<index_t>(cols.size());
    }
  }
  for (int64_t b = 0; b < nbr; ++b) block_rowptr[b + 1] += block_rowptr[b];
  return block_rowptr[nbr];
}

template <typename index_t>
void fill(const WsbBuildParams& p) {
  const BlockRows g = group_by_block_row<index_t>(p);
  const int64_t nbr = wsb_blocks(p.num_rows);
  const auto* row = static_cast<const index_t*>(p.row);
  const auto* col = static_cast<const index_t*>(p.col);
  const auto* block_rowptr = static_cast<const index_t*>(p.block_rowptr);
  auto* block_col = static_cast<index_t*>(p.block_col);
  int mismatch = 0;  // set inside the parallel loop, raised after it (no throw out of OpenMP)
#pragma omp parallel if (worth_threads(p.num_edges))
  {
    std::vector<int64_t> cols;
#pragma omp for schedule(dynamic, 256) reduction(| : mismatch)
    for (int64_t b = 0; b < nbr; ++b) {
      block_columns<index_t>(p, g, b, cols);
      const int64_t first = block_rowptr[b];
      if (block_rowptr[b + 1] - first != static_cast<int64_t>(cols.size())) {
        mismatch = 1;
        continue;
      }
      for (size_t i = 0; i < cols.size(); ++i) block_col[first + i] = static_cast<index_t>(cols[i]);
      for (int64_t k = g.start[b]; k < g.start[b + 1]; ++k) {
        const int64_t e = g.edges[k], r = row[e], c = col[e];
        const int64_t tile =
            first + (std::lower_bound(cols.begin(), cols.end(), c / kWsbTile) - cols.begin());
        p.pos[e] = tile * kWsbTileSize + (r % kWsbTile) * kWsbTile + c % kWsbTile;
      }
    }
  }
  GNNIO_CHECK(!mismatch, ErrorKind::kInternal, "wsb_fill_cpu: block_rowptr is not this graph's");
}

}  // namespace

int64_t wsb_count_tiles_cpu(const WsbBuildParams& p) {
  GNNIO_CHECK(p.num_edges >= 0 && p.num_rows >= 0 && p.num_cols >= 0, ErrorKind::kInvalidArgument,
              "wsb_build: negative size");
  return dispatch_index(p.index_type, [&](auto tag) { return count_tiles<decltype(tag)>(p); });
}

void wsb_fill_cpu(const WsbBuildParams& p) {
  GNNIO_CHECK(p.num_edges >= 0 && p.num_rows >= 0 && p.num_cols >= 0, ErrorKind::kInvalidArgument,
              "wsb_build: negative size");
  dispatch_index(p.index_type, [&](auto tag) { fill<decltype(tag)>(p); });
}

}  // namespace gnnio
