// The planner's split of one CSR into light rows (one warp each) and heavy rows processed as
// work items (heavy index, first slot, end slot) whose partial results are merged in item
// order (so the result does not depend on scheduling). Chosen by gnnio.plan, read by kernels.
#pragma once

#include <cstdint>

namespace gnnio {

struct RowSplit {
  const int64_t* heavy_rows = nullptr;   // [num_heavy] row ids, increasing
  const int64_t* heavy_items = nullptr;  // [num_items, 3], items of one row contiguous, in slot order
  int64_t num_heavy = 0;
  int64_t num_items = 0;
  int64_t light_max_degree = INT64_MAX;  // rows with more slots are heavy
};

}  // namespace gnnio
