// The elementwise passes of Muon's update on the GPU (the Newton-Schulz
// products go through cuBLAS, server/cuda/cublas.h), each the per-element
// fp32 arithmetic of server/optim/muon.cc in its order (IEEE operations, no
// contraction). Plain C++: device pointers, streams as `void*`;
// asynchronous, errors of the launch only.
#ifndef SHARDOPT_SERVER_CUDA_MUON_KERNELS_H_
#define SHARDOPT_SERVER_CUDA_MUON_KERNELS_H_

#include <cstddef>

#include "absl/status/status.h"

namespace shardopt {
namespace gpu {

// For each element e = (i, j) of a rows x cols matrix: buffer[e] =
// lerp(buffer[e], grad[e], keep); u = nesterov ? lerp(grad[e], buffer[e],
// momentum) : buffer[e]; x[transpose ? j * rows + i : e] = u (torch.lerp's
// formula, as TorchLerp).
absl::Status MuonMomentum(const float* grad, float* buffer, float* x, size_t rows, size_t cols,
                          float keep, float momentum, bool nesterov, bool transpose, void* stream);

// x[i] = x[i] / divisor.
absl::Status DivideInPlace(float* x, size_t n, float divisor, void* stream);

// params[e] = params[e] * decay + neg_lr * x[transpose ? j * rows + i : e].
absl::Status MuonApply(float* params, const float* x, size_t rows, size_t cols, bool transpose,
                       float decay, float neg_lr, void* stream);

}  // namespace gpu
}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CUDA_MUON_KERNELS_H_
