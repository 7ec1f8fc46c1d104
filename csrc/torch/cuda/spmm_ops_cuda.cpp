// CUDA implementations of the SpMM family, and the per-Graph cache of cuSPARSE plans.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>

#include "../cache_registry.h"
#include "../spmm_common.h"
#include "gnnio/spmm/policy.h"

namespace gnnio::binding {
namespace {

// A cuSPARSE plan (descriptors + workspace size) and its workspace, kept for one Graph's CSR,
// one value array, dtype and width. Entries are evicted when the Graph is released, and at most
// kMaxPlansPerGraph are kept per Graph (user-supplied edge weights make a new value pointer on
// every call).
struct CachedPlan {
  int64_t cache_key;
  int device;
  void* stream;  // the workspace is used on this stream only
  std::unique_ptr<SpmmCudaPlan> plan;
  at::Tensor workspace;
};

constexpr size_t kMaxPlansPerGraph = 8;

std::mutex& cache_mutex() {
  static std::mutex m;
  return m;
}
std::list<CachedPlan>& cache() {
  static std::list<CachedPlan> c;
  return c;
}

const bool hook_registered = [] {
  register_cache_release_hook([](int64_t key) {
    std::lock_guard<std::mutex> lock(cache_mutex());
    cache().remove_if([key](const CachedPlan& e) { return e.cache_key == key; });
  });
  return true;
}();

SpmmPolicy policy_from_env() {
  SpmmPolicy policy;
  const char* alg = std::getenv("GNNIO_SPMM_ALG");
  if (alg && std::strcmp(alg, "default") == 0) policy.algorithm = SpmmAlgorithm::kCusparseDefault;
  if (alg && std::strcmp(alg, "rowwarp") == 0) policy.algorithm = SpmmAlgorithm::kRowWarp;
  return policy;
}

void run_spmm(const SpmmParams& p, int64_t cache_key, int device) {
  void* handle = at::cuda::getCurrentCUDASparseHandle();
  void* stream = at::cuda::getCurrentCUDAStream().stream();
  static const SpmmPolicy env_policy = policy_from_env();
  SpmmPolicy policy = env_policy;
  policy.deterministic = at::globalContext().deterministicAlgorithms();
  policy.algorithm = choose_spmm_algorithm(p, policy);
  if (policy.algorithm == SpmmAlgorithm::kRowWarp) {
    spmm_cuda_row_warp(p, stream);
    return;
  }
  if (cache_key < 0 || !cache_is_live(cache_key)) {
    SpmmCudaPlan plan(p, policy, handle);
    auto ws = at::empty({static_cast<int64_t>(plan.workspace_bytes())},
                        at::TensorOptions().device(at::kCUDA, device).dtype(at::kByte));
    plan.run(p, handle, ws.data_ptr(), stream);
    return;
  }
  std::lock_guard<std::mutex> lock(cache_mutex());
  auto& entries = cache();
  auto it = entries.begin();
  for (; it != entries.end(); ++it)
    if (it->cache_key == cache_key && it->device == device && it->stream == stream &&
        it->plan->matches(p))
      break;
  if (it == entries.end()) {
    size_t same_key = 0;
    for (auto& e : entries) same_key += e.cache_key == cache_key;
    if (same_key >= kMaxPlansPerGraph) {  // drop this Graph's least recently used plan
      for (auto e = entries.rbegin(); e != entries.rend(); ++e)
        if (e->cache_key == cache_key) {
          entries.erase(std::next(e).base());
          break;
        }
    }
    auto plan = std::make_unique<SpmmCudaPlan>(p, policy, handle);
    auto ws = at::empty({static_cast<int64_t>(plan->workspace_bytes())},
                        at::TensorOptions().device(at::kCUDA, device).dtype(at::kByte));
    entries.push_front(CachedPlan{cache_key, device, stream, std::move(plan), ws});
    it = entries.begin();
  } else if (it != entries.begin()) {
    entries.splice(entries.begin(), entries, it);  // most recently used first
    it = entries.begin();
  }
  it->plan->run(p, handle, it->workspace.data_ptr(), stream);
}

at::Tensor spmm_cuda_impl(const at::Tensor& rowptr, const at::Tensor& col,
                          const c10::optional<at::Tensor>& value, const at::Tensor& x,
                          int64_t num_rows, int64_t num_cols, int64_t cache_key,
                          const at::Tensor& /*rowptr_t*/, const at::Tensor& /*col_t*/,
                          const c10::optional<at::Tensor>& /*value_t*/, int64_t /*cache_key_t*/) {
  const c10::cuda::CUDAGuard guard(x.device());
  check_csr(rowptr, col, num_rows, "spmm");  // num_rows >= 0 before the allocation
  const at::Tensor xs = x.dim() == 2 && x.size(1) > 1 && x.stride(1) != 1 ? x.contiguous() : x;
  auto out = at::empty({num_rows, xs.dim() == 2 ? xs.size(1) : 0}, xs.options());
  SpmmParams p = spmm_params(rowptr, col, value, xs, num_rows, num_cols, out);
  if (p.nnz == 0 || p.num_rows == 0 || p.width == 0) return out.zero_();
  at::Tensor ones;
  if (!p.value) {  // cuSPARSE needs explicit values; gnnio.Graph passes cached ones instead
    ones = at::ones({p.nnz}, xs.options());
    p.value = ones.data_ptr();
    cache_key = -1;
  }
  translate_errors([&] { run_spmm(p, cache_key, xs.get_device()); });
  return out;
}

at::Tensor sddmm_cuda_impl(const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& a,
                           const at::Tensor& b) {
  const c10::cuda::CUDAGuard guard(a.device());
  auto out = at::empty({col.numel()}, a.options());
  const SddmmParams p = sddmm_params(rowptr, col, a, b, out);
  translate_errors([&] { sddmm_cuda(p, at::cuda::getCurrentCUDAStream().stream()); });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, CUDA, m) {
  m.impl("spmm", &spmm_cuda_impl);
  m.impl("sddmm", &sddmm_cuda_impl);
}

}  // namespace gnnio::binding
