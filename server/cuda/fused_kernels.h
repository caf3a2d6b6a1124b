// Internal to //server/cuda: the kernels' argument blocks and launchers,
// shared by fused_optimizers.cc (host: validation, scalars, access plan) and
// fused_kernels.cu (device code). The scalars are already fp32, computed on
// the host exactly as server/optim's Update computes them.
#ifndef SHARDOPT_SERVER_CUDA_FUSED_KERNELS_H_
#define SHARDOPT_SERVER_CUDA_FUSED_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "server/cuda/fused_optimizers.h"

namespace shardopt {
namespace gpu {
namespace internal {

inline constexpr int kThreadsPerBlock = 256;

// Passed by value (as a __grid_constant__ kernel parameter: indexing `ptr`
// with the run-time rank reads the parameter bank, no local copy).
struct GradArgs {
  const float* ptr[kMaxGradientBuffers];
  int count;
  int divide;     // kMean with count > 1
  float divisor;  // float(count)
};

// Element ranges, relative to element 0 of every buffer.
struct RangeArgs {
  size_t n;
  int vectorized;  // 0: elements [0, n) one at a time
  size_t head;     // vectorized: [0, head) singly,
  size_t groups;   //   [head, head + 4 * groups) as float4,
                   //   [head + 4 * groups, n) singly.
};

struct SgdScalars {
  float weight_decay;
  float neg_lr;
  float momentum;
  float one_minus_dampening;
  int maximize;
  int has_weight_decay;
  int first_step;  // momentum: buf = g without reading buf
  int nesterov;
};

struct SgdArgs {
  GradArgs grads;
  RangeArgs range;
  float* params;
  float* momentum_buffer;  // null: no momentum
  uint16_t* params_bf16;   // null: no bf16 copy
  SgdScalars s;
};

struct AdamScalars {
  float weight_decay;  // Adam's L2 term
  float decay;         // AdamW's 1 - lr * weight_decay
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float bias_correction2_sqrt;
  float eps;
  float neg_step_size;
  int maximize;
  int l2;         // Adam with weight_decay != 0
  int decoupled;  // AdamW with decay != 1.0f
};

struct AdamArgs {
  GradArgs grads;
  RangeArgs range;
  float* params;
  float* exp_avg;
  float* exp_avg_sq;
  float* max_exp_avg_sq;  // null: no amsgrad
  uint16_t* params_bf16;
  AdamScalars s;
};

struct AdagradScalars {
  float weight_decay;
  float eps;
  float neg_clr;
  int maximize;
  int has_weight_decay;
};

struct AdagradArgs {
  GradArgs grads;
  RangeArgs range;
  float* params;
  float* sum;
  uint16_t* params_bf16;
  AdagradScalars s;
};

struct LionScalars {
  float decay;  // 1 - lr * weight_decay
  float beta1;
  float one_minus_beta1;
  float beta2;
  float one_minus_beta2;
  float neg_lr;
  int maximize;
  int has_weight_decay;
};

struct LionArgs {
  GradArgs grads;
  RangeArgs range;
  float* params;
  float* exp_avg;
  uint16_t* params_bf16;
  LionScalars s;
};

// Each enqueues one kernel on `stream` and returns cudaGetLastError().
cudaError_t LaunchSgd(const SgdArgs& args, cudaStream_t stream);
cudaError_t LaunchAdam(const AdamArgs& args, cudaStream_t stream);
cudaError_t LaunchAdagrad(const AdagradArgs& args, cudaStream_t stream);
cudaError_t LaunchLion(const LionArgs& args, cudaStream_t stream);
cudaError_t LaunchConvertToBf16(const float* src, uint16_t* dst, const RangeArgs& range,
                                cudaStream_t stream);
cudaError_t LaunchFill(float* dst, float value, size_t n, cudaStream_t stream);

}  // namespace internal
}  // namespace gpu
}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CUDA_FUSED_KERNELS_H_
