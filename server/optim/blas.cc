#include "server/optim/blas.h"

#include <cblas.h>

namespace shardopt::blas {

void Sgemm(bool transpose_a, bool transpose_b, size_t m, size_t n, size_t k, float alpha,
           const float* a, size_t lda, const float* b, size_t ldb, float beta, float* c,
           size_t ldc) {
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
              transpose_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

}  // namespace shardopt::blas
