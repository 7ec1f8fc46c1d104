// The SpMM family: out = A · x over a CSR matrix A (rows = destinations, columns = sources),
// and its companion SDDMM, which gives the gradient of A's values.
//
// These structs are the kernels' whole world: raw pointers, sizes and strides. The binding fills
// them in one place; the CPU and CUDA implementations read the same fields.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gnnio/common/types.h"

namespace gnnio {

struct SpmmPolicy;

struct SpmmParams {
  const void* rowptr = nullptr;  // [num_rows + 1]
  const void* col = nullptr;     // [nnz] column (source node) of each CSR slot
  const void* value = nullptr;   // [nnz] weight of each slot, same type as x; nullptr = all ones
  IndexType index_type = IndexType::kInt64;

  const void* x = nullptr;  // [num_cols, width], rows x_row_stride elements apart, unit column stride
  void* out = nullptr;      // [num_rows, width], rows out_row_stride elements apart
  ScalarType scalar_type = ScalarType::kFloat32;  // of value, x and out

  int64_t num_rows = 0;
  int64_t num_cols = 0;
  int64_t nnz = 0;
  int64_t width = 0;
  int64_t x_row_stride = 0;
  int64_t out_row_stride = 0;
};

// grad_value[k] = sum_f a[row(k), f] * b[col[k], f] for every CSR slot k (SDDMM).
struct SddmmParams {
  const void* rowptr = nullptr;  // [num_rows + 1]
  const void* col = nullptr;     // [nnz]
  IndexType index_type = IndexType::kInt64;

  const void* a = nullptr;  // [num_rows, width] (the output gradient), contiguous rows
  const void* b = nullptr;  // [num_cols, width] (the input features), contiguous rows
  void* out = nullptr;      // [nnz]
  ScalarType scalar_type = ScalarType::kFloat32;

  int64_t num_rows = 0;
  int64_t nnz = 0;
  int64_t width = 0;
  int64_t a_row_stride = 0;
  int64_t b_row_stride = 0;
};

// CPU: OpenMP over rows; each output row is accumulated in one thread in slot order, so the
// result is deterministic. float32 accumulates in float32 like cuSPARSE; float64 in float64.
void spmm_cpu(const SpmmParams& p);
void sddmm_cpu(const SddmmParams& p);

#ifdef GNNIO_WITH_CUDA
// cuSPARSE SpMM with its descriptors and workspace size computed once per (graph, dtype, width):
// an SpmmCudaPlan is what gnnio.Graph caches. `handle` is a cusparseHandle_t, `stream` a
// cudaStream_t; the workspace is allocated by the caller (the framework's allocator).
class SpmmCudaPlan {
 public:
  SpmmCudaPlan(const SpmmParams& p, const SpmmPolicy& policy, void* handle);
  ~SpmmCudaPlan();
  SpmmCudaPlan(const SpmmCudaPlan&) = delete;
  SpmmCudaPlan& operator=(const SpmmCudaPlan&) = delete;

  size_t workspace_bytes() const { return workspace_bytes_; }
  // True when p describes the same sparse matrix, dtype and dense shape this plan was made for.
  bool matches(const SpmmParams& p) const;
  // Runs out = A · x for the x / out pointers in p (the sparse part must match()).
  void run(const SpmmParams& p, void* handle, void* workspace, void* stream);

 private:
  SpmmParams key_;
  void* sparse_ = nullptr;  // cusparseSpMatDescr_t
  void* dense_x_ = nullptr;  // cusparseDnMatDescr_t
  void* dense_out_ = nullptr;
  int alg_ = 0;  // cusparseSpMMAlg_t
  size_t workspace_bytes_ = 0;
};

// gnnio's own row-per-warp CSR SpMM (deterministic); `value` must be set.
void spmm_cuda_row_warp(const SpmmParams& p, void* stream);

void sddmm_cuda(const SddmmParams& p, void* stream);
#endif

}  // namespace gnnio
