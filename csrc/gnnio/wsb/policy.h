// Policy of the WSB kernels, kept apart from the kernels (mechanism, cuda.cu). One
// configuration is instantiated (DESIGN.md: no combinatorial builds); a second would be a new
// row of this file chosen by the planner, with the measurement that justified it.
#pragma once

namespace gnnio {

// The tensor-core SpMM: one CTA per (block row, feature chunk). Each warp owns kFragsPerWarp
// 16-wide output fragments of the block row, so a CTA covers kWarps * kFragsPerWarp * 16
// features and reads each tile and each 16-row block of x once for all of them.
// 4 x 2 x 16 = 128 = DESIGN.md's feature width: one CTA per block row there. Not yet tuned on the
// H200; narrower inputs leave warps idle, wider ones take several chunks.
struct WsbSpmmConfig {
  static constexpr int kWarps = 4;
  static constexpr int kFragsPerWarp = 2;
  static constexpr int kChunk = kWarps * kFragsPerWarp * 16;  // features per CTA
};

// The tile-gradient SDDMM: one warp per tile, features staged through shared memory in chunks
// of one lane each (32), kWarps warps per CTA.
struct WsbSddmmConfig {
  static constexpr int kWarps = 4;
};

// GAT attention on tiles (attention.h): one warp per work item (block row, head) of the
// forward and pass A, (source block, head) of pass B, kWarps items a CTA (so a CTA serves
// several block rows when there are fewer heads than warps). A warp stages its head's 16 x C
// blocks (padded to 16) in its own shared-memory slab sized for a channel capacity: 10.25 KiB
// (float32) in the forward, 18.5 KiB in the backward, which holds two such blocks, at
// kWsbAttentionMaxChannels. Within 48 KB of static shared memory: 4 warps forward, 2 backward.
// Heads of at most kNarrowChannels run a second build whose slabs (4.25 / 6.5 KiB) and
// accumulator fragments (2 instead of 8) are sized for them: the kernels wait on memory one
// tile at a time, so the warps an SM holds set their speed, and the wide build's registers and
// slabs held 16 (forward) and 10 (backward) a SM at 32 channels (bench/NOTES.md, WSB attention v2).
struct WsbAttentionConfig {
  static constexpr int kForwardWarps = 4;
  static constexpr int kBackwardWarps = 2;
  static constexpr int kNarrowChannels = 32;
  static_assert(kNarrowChannels % 16 == 0, "a capacity is whole 16-wide fragments");
};

}  // namespace gnnio
