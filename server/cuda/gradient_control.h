// Device passes for steps with gradient control (clipping, loss scaling),
// computing exactly what CpuBackend computes so both backends give the same
// bits: the reduction over trainers in rank order, the sum of squares in
// fixed blocks each summed sequentially in double, and one multiply.
// Plain C++: streams are `void*` (cudaStream_t). Launches are asynchronous.
#ifndef SHARDOPT_SERVER_CUDA_GRADIENT_CONTROL_H_
#define SHARDOPT_SERVER_CUDA_GRADIENT_CONTROL_H_

#include <cstddef>

#include "absl/status/status.h"

namespace shardopt {
namespace gpu {

// `staging` holds `trainers` buffers of `n` floats, buffer t at
// staging + t * stride (stride >= n). Buffer 0 becomes g0 + g1 + ... (in rank
// order), divided by `trainers` when `mean`.
absl::Status ReduceInPlace(float* staging, size_t n, size_t stride, int trainers, bool mean,
                           void* stream);

// block_sums[b] = sum over i in block b (of `block_elements`) of
// double(g[i] * scale)^2, each block summed sequentially from its start.
absl::Status BlockSumsOfSquares(const float* g, size_t n, float scale, size_t block_elements,
                                double* block_sums, void* stream);

// g[i] *= multiplier.
absl::Status ScaleInPlace(float* g, size_t n, float multiplier, void* stream);

// What a push received into device staging holds (the device data plane):
// found[0] becomes the least i < n with g[i] NaN or inf (left as is when
// none), found[1] the least i inside the `num_spans` spans [spans[2k],
// spans[2k+1]) (indices into g) with g[i] neither +0 nor -0. `found` and
// `spans` are device memory; the caller presets found[0] = n and found[1]
// = UINT64_MAX.
absl::Status ScanReceived(const float* g, size_t n, const unsigned long long* spans,
                          size_t num_spans, unsigned long long* found, void* stream);

}  // namespace gpu
}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CUDA_GRADIENT_CONTROL_H_
