#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cusparse.h>

#include "gnnio/common/convert.cuh"
#include "gnnio/common/cuda_check.h"
#include "gnnio/spmm/params.h"
#include "gnnio/spmm/policy.h"

#define GNNIO_CUSPARSE_CHECK(expr)                                                         \
  do {                                                                                     \
    cusparseStatus_t gnnio_status_ = (expr);                                               \
    GNNIO_CHECK(gnnio_status_ == CUSPARSE_STATUS_SUCCESS, ::gnnio::ErrorKind::kInternal,   \
                "cuSPARSE call failed (", cusparseGetErrorString(gnnio_status_), "): ", #expr); \
  } while (0)

namespace gnnio {
namespace {

cudaDataType value_type(ScalarType t) {
  switch (t) {
    case ScalarType::kFloat32: return CUDA_R_32F;
    case ScalarType::kFloat64: return CUDA_R_64F;
    case ScalarType::kFloat16: return CUDA_R_16F;
    case ScalarType::kBFloat16: return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

// Half-precision inputs accumulate in float32.
cudaDataType compute_type(ScalarType t) {
  return t == ScalarType::kFloat64 ? CUDA_R_64F : CUDA_R_32F;
}

cusparseIndexType_t index_type(IndexType t) {
  return t == IndexType::kInt32 ? CUSPARSE_INDEX_32I : CUSPARSE_INDEX_64I;
}

cusparseHandle_t as_handle(void* h) { return static_cast<cusparseHandle_t>(h); }

}  // namespace

SpmmCudaPlan::SpmmCudaPlan(const SpmmParams& p, const SpmmPolicy& policy, void* handle)
    : key_(p) {
  GNNIO_CHECK(p.nnz > 0 && p.num_rows > 0 && p.num_cols > 0 && p.width > 0 && p.value &&
                  cusparse_accepts(p),
              ErrorKind::kInternal, "SpmmCudaPlan: cuSPARSE cannot take this problem (rows ",
              p.num_rows, ", cols ", p.num_cols, ", nnz ", p.nnz, ", width ", p.width, ")");
  cusparseSpMatDescr_t sparse = nullptr;
  GNNIO_CUSPARSE_CHECK(cusparseCreateCsr(
      &sparse, p.num_rows, p.num_cols, p.nnz, const_cast<void*>(p.rowptr),
      const_cast<void*>(p.col), const_cast<void*>(p.value), index_type(p.index_type),
      index_type(p.index_type), CUSPARSE_INDEX_BASE_ZERO, value_type(p.scalar_type)));
  sparse_ = sparse;
  cusparseDnMatDescr_t dense_x = nullptr, dense_out = nullptr;
  GNNIO_CUSPARSE_CHECK(cusparseCreateDnMat(&dense_x, p.num_cols, p.width, p.x_row_stride,
                                           const_cast<void*>(p.x), value_type(p.scalar_type),
                                           CUSPARSE_ORDER_ROW));
  dense_x_ = dense_x;
  GNNIO_CUSPARSE_CHECK(cusparseCreateDnMat(&dense_out, p.num_rows, p.width, p.out_row_stride,
                                           p.out, value_type(p.scalar_type), CUSPARSE_ORDER_ROW));
  dense_out_ = dense_out;

  alg_ = policy.algorithm == SpmmAlgorithm::kCusparseCsrAlg2 ? CUSPARSE_SPMM_CSR_ALG2
                                                              : CUSPARSE_SPMM_ALG_DEFAULT;
  const double alpha64 = 1, beta64 = 0;
  const float alpha32 = 1, beta32 = 0;
  const bool f64 = p.scalar_type == ScalarType::kFloat64;
  GNNIO_CUSPARSE_CHECK(cusparseSpMM_bufferSize(
      as_handle(handle), CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE,
      f64 ? static_cast<const void*>(&alpha64) : &alpha32, sparse, dense_x,
      f64 ? static_cast<const void*>(&beta64) : &beta32, dense_out, compute_type(p.scalar_type),
      static_cast<cusparseSpMMAlg_t>(alg_), &workspace_bytes_));
}

SpmmCudaPlan::~SpmmCudaPlan() {
  if (sparse_) cusparseDestroySpMat(static_cast<cusparseSpMatDescr_t>(sparse_));
  if (dense_x_) cusparseDestroyDnMat(static_cast<cusparseDnMatDescr_t>(dense_x_));
  if (dense_out_) cusparseDestroyDnMat(static_cast<cusparseDnMatDescr_t>(dense_out_));
}

bool SpmmCudaPlan::matches(const SpmmParams& p) const {
  return p.rowptr == key_.rowptr && p.col == key_.col && p.value == key_.value &&
         p.index_type == key_.index_type && p.scalar_type == key_.scalar_type &&
         p.num_rows == key_.num_rows && p.num_cols == key_.num_cols && p.nnz == key_.nnz &&
         p.width == key_.width && p.x_row_stride == key_.x_row_stride &&
         p.out_row_stride == key_.out_row_stride;
}

void SpmmCudaPlan::run(const SpmmParams& p, void* handle, void* workspace, void* stream) {
  GNNIO_CHECK(matches(p), ErrorKind::kInternal, "SpmmCudaPlan::run on a different problem");
  GNNIO_CUSPARSE_CHECK(cusparseSetStream(as_handle(handle), static_cast<cudaStream_t>(stream)));
  GNNIO_CUSPARSE_CHECK(
      cusparseDnMatSetValues(static_cast<cusparseDnMatDescr_t>(dense_x_), const_cast<void*>(p.x)));
  GNNIO_CUSPARSE_CHECK(cusparseDnMatSetValues(static_cast<cusparseDnMatDescr_t>(dense_out_), p.out));
  const double alpha64 = 1, beta64 = 0;
  const float alpha32 = 1, beta32 = 0;
  const bool f64 = p.scalar_type == ScalarType::kFloat64;
  GNNIO_CUSPARSE_CHECK(cusparseSpMM(
      as_handle(handle), CUSPARSE_OPERATION_NON_TRANSPOSE, CUSPARSE_OPERATION_NON_TRANSPOSE,
      f64 ? static_cast<const void*>(&alpha64) : &alpha32,
      static_cast<cusparseSpMatDescr_t>(sparse_), static_cast<cusparseDnMatDescr_t>(dense_x_),
      f64 ? static_cast<const void*>(&beta64) : &beta32,
      static_cast<cusparseDnMatDescr_t>(dense_out_), compute_type(p.scalar_type),
      static_cast<cusparseSpMMAlg_t>(alg_), workspace));
}

// ---------------------------------------------------------------------------------------------
// SDDMM: one warp per CSR slot, lanes across features; the slot's row is found by binary search
// in rowptr (log2 N steps that stay in L2), so a row of a million slots spreads over many warps.

namespace {

template <typename scalar_t, typename index_t>
__global__ void sddmm_kernel(const index_t* __restrict__ rowptr, const index_t* __restrict__ col,
                             const scalar_t* __restrict__ a, const scalar_t* __restrict__ b,
                             scalar_t* __restrict__ out, int64_t num_rows, int64_t nnz,
                             int64_t width, int64_t a_stride, int64_t b_stride) {
  using acc_t = acc_type_t<scalar_t>;
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t k = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; k < nnz; k += warps) {
    int64_t lo = 0, hi = num_rows;  // last row r with rowptr[r] <= k
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (int64_t(rowptr[mid]) <= k) lo = mid; else hi = mid;
    }
    const scalar_t* ar = a + lo * a_stride;
    const scalar_t* br = b + int64_t(col[k]) * b_stride;
    acc_t acc = 0;
    for (int64_t f = lane; f < width; f += 32) acc += to_acc(ar[f]) * to_acc(br[f]);
    for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_down_sync(0xffffffffu, acc, offset);
    if (lane == 0) out[k] = from_acc<scalar_t>(acc);
  }
}

template <typename scalar_t, typename index_t>
void launch_sddmm(const SddmmParams& p, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((p.nnz * 32 + kThreads - 1) / kThreads, 1 << 20);
  sddmm_kernel<scalar_t, index_t><<<static_cast<int>(blocks), kThreads, 0, stream>>>(
      static_cast<const index_t*>(p.rowptr), static_cast<const index_t*>(p.col),
      static_cast<const scalar_t*>(p.a), static_cast<const scalar_t*>(p.b),
      static_cast<scalar_t*>(p.out), p.num_rows, p.nnz, p.width, p.a_row_stride, p.b_row_stride);
  GNNIO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// gnnio's own CSR SpMM: one warp per row, deterministic (each output element is summed by one
// lane in slot order; for width 1 the lanes split the row's slots and reduce in a fixed tree).
// It serves the shapes cuSPARSE does not: more slots than rows x cols (duplicate edges) and
// one-column products.

namespace {

template <typename scalar_t, typename index_t>
__global__ void spmm_row_warp_kernel(const index_t* __restrict__ rowptr,
                                     const index_t* __restrict__ col,
                                     const scalar_t* __restrict__ value,
                                     const scalar_t* __restrict__ x, scalar_t* __restrict__ out,
                                     int64_t num_rows, int64_t width, int64_t x_stride,
                                     int64_t out_stride) {
  using acc_t = acc_type_t<scalar_t>;
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / 32; r < num_rows; r += warps) {
    const int64_t begin = rowptr[r], end = rowptr[r + 1];
    if (width == 1) {
      acc_t acc = 0;
      for (int64_t k = begin + lane; k < end; k += 32)
        acc += to_acc(value[k]) * to_acc(x[int64_t(col[k]) * x_stride]);
      for (int offset = 16; offset > 0; offset /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, offset);
      if (lane == 0) out[r * out_stride] = from_acc<scalar_t>(acc);
      continue;
    }
    for (int64_t f = lane; f < width; f += 32) {
      acc_t acc = 0;
      for (int64_t k = begin; k < end; ++k)
        acc += to_acc(value[k]) * to_acc(x[int64_t(col[k]) * x_stride + f]);
      out[r * out_stride + f] = from_acc<scalar_t>(acc);
    }
  }
}

template <typename scalar_t, typename index_t>
void launch_row_warp(const SpmmParams& p, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t blocks = std::min<int64_t>((p.num_rows * 32 + kThreads - 1) / kThreads, 1 << 20);
  spmm_row_warp_kernel<scalar_t, index_t><<<static_cast<int>(std::max<int64_t>(blocks, 1)), kThreads, 0, stream>>>(
      static_cast<const index_t*>(p.rowptr), static_cast<const index_t*>(p.col),
      static_cast<const scalar_t*>(p.value), static_cast<const scalar_t*>(p.x),
      static_cast<scalar_t*>(p.out), p.num_rows, p.width, p.x_row_stride, p.out_row_stride);
  GNNIO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void spmm_cuda_row_warp(const SpmmParams& p, void* stream) {
  GNNIO_CHECK(p.value != nullptr, ErrorKind::kInternal, "spmm_cuda_row_warp needs values");
  if (p.num_rows == 0 || p.width == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_cuda(p.scalar_type, p.index_type, [&](auto scalar, auto index) {
    launch_row_warp<decltype(scalar), decltype(index)>(p, s);
  });
}

void sddmm_cuda(const SddmmParams& p, void* stream) {
  if (p.nnz == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  dispatch_cuda(p.scalar_type, p.index_type, [&](auto scalar, auto index) {
    launch_sddmm<decltype(scalar), decltype(index)>(p, s);
  });
}

}  // namespace gnnio
