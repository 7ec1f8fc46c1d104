// Caches keyed on a gnnio.Graph (its cache_key) register a release hook here, so that one
// release_cache op frees every per-graph cache when the Graph is garbage-collected.
#pragma once

#include <cstdint>
#include <functional>

namespace gnnio::binding {

void register_cache_release_hook(std::function<void(int64_t)> hook);

// True between register_cache(key) and release_cache(key).
bool cache_is_live(int64_t cache_key);

}  // namespace gnnio::binding
