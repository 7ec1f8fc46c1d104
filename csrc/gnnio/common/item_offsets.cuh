// RowSplit::item_offsets on the device: the first item of each heavy row, built per call in a
// launcher's workspace by every CUDA kernel family that merges heavy rows' items (attention,
// TransformerConv's fused form), so that a merge block finds its items with two loads instead
// of two binary searches of heavy_items (17 dependent loads each at 100K items). Not an input of
// any op.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gnnio/common/cuda_check.h"
#include "gnnio/common/row_split.h"

namespace gnnio {

// Workspace bytes of a split's RowSplit::item_offsets table: none without heavy rows (no merge).
inline size_t item_offsets_bytes(const RowSplit& s) {
  return s.num_heavy > 0 ? static_cast<size_t>(s.num_heavy + 1) * sizeof(int64_t) : 0;
}

namespace {  // a kernel that is no template: each .cu including this keeps its own copy

constexpr int kItemOffsetsThreads = 256;

// RowSplit::item_offsets of s, one thread per t in [0, num_items]: with owner(t) the heavy index
// of item t, owner(-1) = -1 and owner(num_items) = num_heavy, thread t writes t to the entries
// (owner(t - 1), owner(t)]: the rows whose first item is t (a row without items, which only a
// raw op call can give, gets the next row's first item, as a lower-bound search would) and, for
// the last, offsets[num_heavy] = num_items. Items sorted by owner write each entry once: no
// atomics, the same table every run. Owners are clamped to [0, num_heavy] so that bad items of
// a raw call cannot write outside the table; any owners still write every entry, in [0, num_items].
__global__ void item_offsets_kernel(RowSplit s, int64_t* offsets) {
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (t > s.num_items) return;
  auto owner = [&](int64_t u) -> int64_t {
    if (u < 0) return -1;
    if (u >= s.num_items) return s.num_heavy;
    const int64_t o = s.heavy_items[u * 3];
    return o < 0 ? 0 : (o > s.num_heavy ? s.num_heavy : o);
  };
  const int64_t last = owner(t);
  for (int64_t r = owner(t - 1) + 1; r <= last; ++r) offsets[r] = t;
}

// Fills s's item_offsets table at `table` (item_offsets_bytes(s) bytes of workspace) on the
// stream and points s at it; a split without heavy rows is left as it is.
inline void fill_item_offsets(RowSplit& s, void* table, cudaStream_t stream) {
  if (s.num_heavy == 0) return;
  auto* offsets = static_cast<int64_t*>(table);
  const int64_t blocks = (s.num_items + kItemOffsetsThreads) / kItemOffsetsThreads;
  item_offsets_kernel<<<static_cast<unsigned>(blocks), kItemOffsetsThreads, 0, stream>>>(s, offsets);
  GNNIO_CUDA_CHECK(cudaGetLastError());
  s.item_offsets = offsets;
}

}  // namespace

}  // namespace gnnio
