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
  // [num_heavy + 1]: first item of each heavy row, then num_items. Filled per call by the CUDA
  // attention launchers and the fused TransformerConv launcher (common/item_offsets.cuh) in
  // their workspace, so that a merge block (one per heavy row and head)
  // finds its items with two loads instead of two binary searches of heavy_items (17 dependent
  // loads each at 100K items). Not part of the op's inputs; nullptr elsewhere (CPU, reduce).
  const int64_t* item_offsets = nullptr;
};

}  // namespace gnnio
