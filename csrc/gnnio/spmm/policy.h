// Policy for the SpMM family, kept apart from the kernels (mechanism). The planner and the
// GNNIO_SPMM_ALG environment variable (read by the binding) choose it.
#pragma once

#include "gnnio/spmm/params.h"

namespace gnnio {

enum class SpmmAlgorithm {
  // cuSPARSE CSR_ALG2: deterministic, for row-major dense operands (gnnio's layout).
  kCusparseCsrAlg2,
  // cuSPARSE's own default choice (CUSPARSE_SPMM_ALG_DEFAULT).
  kCusparseDefault,
  // gnnio's row-per-warp kernel (spmm_cuda_row_warp).
  kRowWarp,
};

struct SpmmPolicy {
  SpmmAlgorithm algorithm = SpmmAlgorithm::kCusparseCsrAlg2;
  // Bitwise-repeatable results. cuSPARSE CSR_ALG2 is not: on the H200 two calls on a graph
  // with a 200K-neighbour row differed in the 6th digit (it splits long rows across blocks).
  // The row-warp kernel sums each output element in slot order in one lane; it is slower on
  // such hubs (one warp walks the whole row).
  bool deterministic = false;
};

// cusparseCreateCsr rejects nnz > rows * cols (seen on the H200 with cuSPARSE 12.6: duplicate
// edges in a small bipartite graph, 900 slots in an 11 x 70 matrix).
inline bool cusparse_accepts(const SpmmParams& p) {
  return static_cast<__int128>(p.nnz) <= static_cast<__int128>(p.num_rows) * p.num_cols;
}

// The mechanism for one call: cuSPARSE where it takes the problem, else the row-warp kernel;
// one-column products (SpMV, e.g. GCN's weighted degrees) also go to the row-warp kernel,
// whose lanes split each row's edges.
inline SpmmAlgorithm choose_spmm_algorithm(const SpmmParams& p, const SpmmPolicy& policy) {
  if (policy.deterministic || !cusparse_accepts(p) || p.width == 1) return SpmmAlgorithm::kRowWarp;
  return policy.algorithm;
}

}  // namespace gnnio
