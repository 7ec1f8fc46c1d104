// Turns CUDA and cuSPARSE status codes into gnnio::Error (only included by .cu files and the
// CUDA half of the binding).
#pragma once

#include <cuda_runtime.h>

#include "gnnio/common/error.h"

#define GNNIO_CUDA_CHECK(expr)                                                        \
  do {                                                                                \
    cudaError_t gnnio_status_ = (expr);                                               \
    GNNIO_CHECK(gnnio_status_ == cudaSuccess, ::gnnio::ErrorKind::kInternal, #expr,   \
                " failed: ", cudaGetErrorString(gnnio_status_));                      \
  } while (0)
