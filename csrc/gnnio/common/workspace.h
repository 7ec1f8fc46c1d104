// Launchers carve several pieces out of one workspace allocation; each piece starts on a
// 256-byte boundary (cudaMalloc's own alignment), whatever the size of the pieces before it.
#pragma once

#include <cstddef>

namespace gnnio {

inline size_t workspace_align(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace gnnio
