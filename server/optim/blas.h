// The one BLAS call the kernels make (Muon's Newton-Schulz products), so that
// the rest of server/optim does not depend on a BLAS header. Debian's
// OpenBLAS (libopenblas-dev) through its CBLAS interface.
#ifndef SHARDOPT_SERVER_OPTIM_BLAS_H_
#define SHARDOPT_SERVER_OPTIM_BLAS_H_

#include <cstddef>

namespace shardopt::blas {

// C = alpha * op(A) * op(B) + beta * C, row-major: op(A) is m x k, op(B)
// k x n, C m x n; lda, ldb, ldc are the row strides of A, B and C as stored.
void Sgemm(bool transpose_a, bool transpose_b, size_t m, size_t n, size_t k, float alpha,
           const float* a, size_t lda, const float* b, size_t ldb, float beta, float* c,
           size_t ldc);

}  // namespace shardopt::blas

#endif  // SHARDOPT_SERVER_OPTIM_BLAS_H_
