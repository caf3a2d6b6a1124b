// Fused CUDA optimizer steps: gradient reduction over T trainers plus the
// torch.optim 1.13 update, one kernel launch over the whole flat range.
//
// Plain C++: no CUDA types; device memory is passed as pointers, streams as
// `void*` (a cudaStream_t; nullptr is the legacy default stream).
//
// What one FusedOptimizerStep does, per element i of [0, n):
//   (a) g = grad[0][i]; g += grad[1][i]; ...; g += grad[T-1][i]   (fp32, rank order)
//       and, for GradientReduction::kMean with T > 1, g /= float(T)
//       -- exactly server/model_shard.cc ModelShard::ApplyStep's reduction;
//   (b) the update of `config.kind` with that g, exactly as the CPU kernels in
//       server/optim (Optimizer::Update) compute it: the step-dependent
//       scalars are computed on the host in double with the same formulas
//       (step capped at 2^24, each scalar cast to fp32 where PyTorch hands a
//       Python float to a tensor op), and every per-element operation is a
//       separately rounded IEEE fp32 operation in the same order (no FMA
//       contraction, IEEE division and square root, denormals kept). The
//       results are therefore bit-identical to the CPU path for every finite
//       or infinite value; NaNs stay NaN (the GPU returns its canonical NaN
//       where x86 propagates an input's payload);
//   (c) optionally params_bf16[i] = bf16(params[i]) of the updated parameter,
//       round-to-nearest-even, NaN kept NaN (see Fp32ToBf16Bits).
// Each parameter and state element is read once and written once; the
// gradients are only read. fp32 AdamW with T = 1 moves 28 bytes per element
// (grad, param, exp_avg, exp_avg_sq read; param, exp_avg, exp_avg_sq written),
// 30 with the bf16 copy.
//
// Memory access: 16-byte (float4) loads and stores when every float buffer
// has the same address modulo 16 bytes (and the bf16 buffer a matching
// address modulo 8): the first up-to-3 elements before the 16-byte boundary
// and the last up-to-3 elements are done one at a time. Otherwise every
// element is done with 4-byte accesses. cudaMalloc memory at the same element
// offset always takes the vector path.
//
// The launch is asynchronous: errors that happen while the kernel runs show
// at the next synchronisation (SynchronizeStream in device.h). The buffers
// must stay allocated until then. Buffers must not overlap, except that the
// gradients may overlap each other (they are only read).
#ifndef SHARDOPT_SERVER_CUDA_FUSED_OPTIMIZERS_H_
#define SHARDOPT_SERVER_CUDA_FUSED_OPTIMIZERS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/optimizer_config.h"

namespace shardopt {
namespace gpu {

// The most gradient buffers one step reduces (their pointers travel in the
// kernel's parameters: 2 KiB).
inline constexpr int kMaxGradientBuffers = 256;

enum class GradientReduction {
  kMean,  // sum in rank order, then divide by T (when T > 1): ApplyStep's default.
  kSum,   // sum in rank order only.
};

// Device buffers of one step. Every buffer holds `n` elements (the `n` of
// FusedOptimizerStep) and lives on the current device.
struct FusedStepBuffers {
  // Host array of `num_gradients` device pointers, one per trainer, in rank
  // order. Only read. The host array is read during the call only.
  const float* const* gradients = nullptr;
  int num_gradients = 0;
  GradientReduction reduction = GradientReduction::kMean;

  // fp32 master parameters, updated in place.
  float* params = nullptr;

  // The optimizer's state, in Optimizer::slot_names() order, updated in
  // place; config.StateSlotsPerElement() of them are used, the rest ignored:
  //   SGD with momentum != 0: {momentum_buffer}   (SGD without momentum: none)
  //   Adam, AdamW:            {exp_avg, exp_avg_sq[, max_exp_avg_sq if amsgrad]}
  //   Adagrad:                {sum}
  // Initialise them as the CPU Optimizer does (InitializeOptimizerState).
  std::array<float*, 3> slots = {nullptr, nullptr, nullptr};

  // Optional: receives the bf16 bit patterns of the updated parameters.
  uint16_t* params_bf16 = nullptr;
};

// How a step would run (for tests and diagnostics); no CUDA call.
struct FusedStepPlan {
  bool vectorized = false;   // float4 path
  size_t head = 0;           // elements done singly before the first 16-byte group
  size_t vector_groups = 0;  // float4 groups
  size_t tail = 0;           // elements done singly after them
  int state_slots = 0;       // slots the optimizer uses
  std::string DebugString() const;
};

// Validates the arguments (no CUDA call): INVALID_ARGUMENT when
// config.Validate() fails, step < 1, num_gradients is not in
// [1, kMaxGradientBuffers], a needed pointer is null (for n > 0), or a float
// pointer is not 4-byte (bf16: 2-byte) aligned. Then decides the access path.
absl::StatusOr<FusedStepPlan> PlanFusedStep(const OptimizerConfig& config, int64_t step, size_t n,
                                            const FusedStepBuffers& buffers);

// Enqueues step `step` (>= 1: PyTorch's state['step'] after the increment,
// as Optimizer::Update takes it) on `stream`. Steps must be applied 1, 2, 3,
// ... as on the CPU (SGD's step 1 initialises the momentum buffer to g
// without reading it). Errors: those of PlanFusedStep, then any CUDA error
// of the launch (as CudaStatus maps it). n == 0 launches nothing.
absl::Status FusedOptimizerStep(const OptimizerConfig& config, int64_t step, size_t n,
                                const FusedStepBuffers& buffers, void* stream = nullptr);

// Fills the state slots as Optimizer::Create does: zeros, Adagrad's sum with
// initial_accumulator_value. Asynchronous on `stream`.
absl::Status InitializeOptimizerState(const OptimizerConfig& config, size_t n,
                                      const std::array<float*, 3>& slots, void* stream = nullptr);

// dst[i] = Fp32ToBf16Bits(src[i]) for [0, n), on the device (vectorised where
// src is 16-byte and dst 8-byte aligned at the same element). Asynchronous.
absl::Status ConvertToBf16(const float* src, uint16_t* dst, size_t n, void* stream = nullptr);

// The conversion the kernels use, on the host: round to nearest, ties to
// even; +-inf stay inf, finite values beyond bf16's range become +-inf (as
// IEEE rounding says), NaN stays NaN: its sign and top 7 payload bits are
// kept and the quiet bit is set (PyTorch's c10::BFloat16 instead writes the
// canonical 0x7FC0; either is a NaN).
uint16_t Fp32ToBf16Bits(float x);

}  // namespace gpu
}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CUDA_FUSED_OPTIMIZERS_H_
