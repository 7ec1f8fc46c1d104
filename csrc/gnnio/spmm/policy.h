// Policy for the SpMM family, kept apart from the kernels (mechanism). The planner and the
// GNNIO_SPMM_ALG environment variable (read by the binding) choose it.
#pragma once

namespace gnnio {

enum class SpmmAlgorithm {
  // cuSPARSE CSR_ALG2: deterministic, for row-major dense operands (gnnio's layout).
  kCusparseCsrAlg2,
  // cuSPARSE's own default choice (CUSPARSE_SPMM_ALG_DEFAULT).
  kCusparseDefault,
};

struct SpmmPolicy {
  SpmmAlgorithm algorithm = SpmmAlgorithm::kCusparseCsrAlg2;
};

}  // namespace gnnio
