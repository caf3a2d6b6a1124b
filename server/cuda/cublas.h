// Cublas: the one cuBLAS call Muon's Newton-Schulz products need, from a
// libcublas loaded at first use with dlopen, so that the server, its tests
// and its container images run without cuBLAS unless a GPU shard updates a
// Muon model.
//
// Contract: Create() makes a handle on the calling thread's current device
// whose products run on `stream`, in full fp32 (CUBLAS_DEFAULT_MATH: no TF32
// unless NVIDIA_TF32_OVERRIDE asks for it). One Cublas per user: a handle
// is used by one thread at a time. The library: $SHARDOPT_CUBLAS_LIBRARY
// alone if set, else libcublas.so.13, then libcublas.so, on the loader's
// path; loaded (or not) once per process.
#ifndef SHARDOPT_SERVER_CUDA_CUBLAS_H_
#define SHARDOPT_SERVER_CUDA_CUBLAS_H_

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardopt {
namespace gpu {

class Cublas {
 public:
  // UNIMPLEMENTED naming the libraries tried when none loads (or lacks a
  // symbol); INTERNAL when the handle cannot be made.
  static absl::StatusOr<std::unique_ptr<Cublas>> Create(void* stream);
  // Whether the library loads (loading it if not yet): Create's
  // UNIMPLEMENTED, without making a handle.
  static absl::Status Available();
  ~Cublas();
  Cublas(const Cublas&) = delete;
  Cublas& operator=(const Cublas&) = delete;

  // C = alpha * op(A) * op(B) + beta * C on device memory, row-major as
  // blas::Sgemm (server/optim/blas.h) takes it; asynchronous on the stream.
  absl::Status Sgemm(bool transpose_a, bool transpose_b, size_t m, size_t n, size_t k, float alpha,
                     const float* a, size_t lda, const float* b, size_t ldb, float beta, float* c,
                     size_t ldc);

  struct Api;  // The resolved functions (cublas.cc).

 private:
  Cublas(const Api* api, void* handle) : api_(api), handle_(handle) {}
  const Api* api_;
  void* handle_;  // A cublasHandle_t.
};

}  // namespace gpu
}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CUDA_CUBLAS_H_
