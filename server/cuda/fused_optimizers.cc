#include "server/cuda/fused_optimizers.h"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/cuda/bf16_bits.h"
#include "server/cuda/cuda_status.h"
#include "server/cuda/fused_kernels.h"

namespace shardopt {
namespace gpu {
namespace {

using internal::AdagradArgs;
using internal::AdamArgs;
using internal::GradArgs;
using internal::LionArgs;
using internal::RangeArgs;
using internal::SgdArgs;

// Same as server/optim/optimizer_internal.h's TorchStep (private to that
// package): PyTorch keeps state['step'] in a float32, which stops growing at
// 2^24, and computes the step-dependent scalars from that.
double TorchStep(int64_t step) {
  constexpr int64_t kFloatStepLimit = int64_t{1} << 24;
  return static_cast<double>(step < kFloatStepLimit ? step : kFloatStepLimit);
}

uintptr_t Address(const void* p) { return reinterpret_cast<uintptr_t>(p); }

// The used slots' names, for error messages.
const char* SlotName(OptimizerKind kind, int slot) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "momentum_buffer";
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW: {
      static const char* const kNames[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
      return kNames[slot];
    }
    case OptimizerKind::kAdagrad:
      return "sum";
    case OptimizerKind::kLion:
      return "exp_avg";
    case OptimizerKind::kLamb:
    case OptimizerKind::kAdafactor:
    case OptimizerKind::kMuon:
      return "slot";  // (Refused by Validate.)
  }
  return "slot";
}

cudaStream_t AsStream(void* stream) { return static_cast<cudaStream_t>(stream); }

// The float4 plan for float buffers `floats` (all n elements) and an optional
// bf16 buffer: vectorized when every float buffer sits at the same address
// modulo 16 and the bf16 buffer, at the first 16-byte-aligned float element,
// is 8-byte aligned.
RangeArgs PlanRange(size_t n, const float* const* floats, int count, const uint16_t* bf16) {
  RangeArgs r{};
  r.n = n;
  r.vectorized = 0;
  r.head = 0;
  r.groups = 0;
  if (n == 0 || count == 0) return r;
  const uintptr_t mis = Address(floats[0]) % 16;
  for (int k = 1; k < count; ++k) {
    if (Address(floats[k]) % 16 != mis) return r;
  }
  size_t head = ((16 - mis) % 16) / sizeof(float);
  if (head > n) head = n;
  if (bf16 != nullptr && (Address(bf16) + head * sizeof(uint16_t)) % 8 != 0) return r;
  const size_t groups = (n - head) / 4;
  if (groups == 0) return r;
  r.vectorized = 1;
  r.head = head;
  r.groups = groups;
  return r;
}

struct Validated {
  FusedStepPlan plan;
  RangeArgs range;
};

absl::StatusOr<Validated> Validate(const OptimizerConfig& config, int64_t step, size_t n,
                                   const FusedStepBuffers& b) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  if (NeedsWholeTensors(config.kind)) {
    return absl::UnimplementedError(absl::StrCat("no fused ", OptimizerKindName(config.kind),
                                                 " kernel yet: train it on the cpu backend"));
  }
  if (step < 1) {
    return absl::InvalidArgumentError(absl::StrCat("step must be >= 1, got ", step));
  }
  if (b.num_gradients < 1 || b.num_gradients > kMaxGradientBuffers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_gradients must be in [1, ", kMaxGradientBuffers, "], got ", b.num_gradients));
  }
  if (b.gradients == nullptr) {
    return absl::InvalidArgumentError("gradients (the host array of device pointers) is null");
  }
  const int slots = config.StateSlotsPerElement();
  Validated v;
  v.plan.state_slots = slots;
  // Every float buffer the kernel touches: gradients, params, used slots.
  const float* floats[kMaxGradientBuffers + 4];
  int count = 0;
  if (n > 0) {
    for (int t = 0; t < b.num_gradients; ++t) {
      if (b.gradients[t] == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("gradients[", t, "] is null"));
      }
      floats[count++] = b.gradients[t];
    }
    if (b.params == nullptr) return absl::InvalidArgumentError("params is null");
    floats[count++] = b.params;
    for (int k = 0; k < slots; ++k) {
      if (b.slots[k] == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(OptimizerKindName(config.kind), " needs slot ", k, " (",
                         SlotName(config.kind, k), "), which is null"));
      }
      floats[count++] = b.slots[k];
    }
    for (int k = 0; k < count; ++k) {
      if (Address(floats[k]) % alignof(float) != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "device buffer ", absl::StrFormat("%p", floats[k]), " is not 4-byte aligned"));
      }
    }
    if (b.params_bf16 != nullptr && Address(b.params_bf16) % alignof(uint16_t) != 0) {
      return absl::InvalidArgumentError("params_bf16 is not 2-byte aligned");
    }
  }
  v.range = PlanRange(n, floats, count, b.params_bf16);
  v.plan.vectorized = v.range.vectorized != 0;
  v.plan.head = v.range.vectorized ? v.range.head : 0;
  v.plan.vector_groups = v.range.vectorized ? v.range.groups : 0;
  v.plan.tail = v.range.vectorized ? n - v.range.head - 4 * v.range.groups : n;
  return v;
}

GradArgs MakeGradArgs(const FusedStepBuffers& b) {
  GradArgs g;
  std::memset(&g, 0, sizeof(g));
  for (int t = 0; t < b.num_gradients; ++t) g.ptr[t] = b.gradients[t];
  g.count = b.num_gradients;
  // ModelShard::ApplyStep: divide = mean_reduction && trainers > 1.
  g.divide = b.reduction == GradientReduction::kMean && b.num_gradients > 1;
  g.divisor = static_cast<float>(b.num_gradients);
  return g;
}

// The scalars below are computed exactly as server/optim/{sgd,adam,adagrad}.cc
// compute them in Update (double on the host; each value PyTorch hands a
// tensor op as a Python float cast to fp32).

SgdArgs MakeSgd(const OptimizerConfig& c, int64_t step, const FusedStepBuffers& b,
                const RangeArgs& range) {
  SgdArgs a;
  std::memset(&a, 0, sizeof(a));
  a.grads = MakeGradArgs(b);
  a.range = range;
  a.params = b.params;
  a.momentum_buffer = c.momentum != 0.0 ? b.slots[0] : nullptr;
  a.params_bf16 = b.params_bf16;
  a.s.weight_decay = static_cast<float>(c.weight_decay);
  a.s.neg_lr = static_cast<float>(-c.lr);
  a.s.momentum = static_cast<float>(c.momentum);
  a.s.one_minus_dampening = static_cast<float>(1.0 - c.dampening);
  a.s.maximize = c.maximize;
  a.s.has_weight_decay = c.weight_decay != 0.0;
  a.s.first_step = step == 1;
  a.s.nesterov = c.nesterov;
  return a;
}

AdamArgs MakeAdam(const OptimizerConfig& c, int64_t step, const FusedStepBuffers& b,
                  const RangeArgs& range) {
  AdamArgs a;
  std::memset(&a, 0, sizeof(a));
  a.grads = MakeGradArgs(b);
  a.range = range;
  a.params = b.params;
  a.exp_avg = b.slots[0];
  a.exp_avg_sq = b.slots[1];
  a.max_exp_avg_sq = c.amsgrad ? b.slots[2] : nullptr;
  a.params_bf16 = b.params_bf16;
  const bool adamw = c.kind == OptimizerKind::kAdamW;
  const double t = TorchStep(step);
  const double bias_correction1 = 1.0 - std::pow(c.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(c.beta2, t);
  const double step_size = c.lr / bias_correction1;
  a.s.weight_decay = static_cast<float>(c.weight_decay);
  a.s.decay = static_cast<float>(1.0 - c.lr * c.weight_decay);
  a.s.beta1 = static_cast<float>(c.beta1);
  a.s.one_minus_beta1 = static_cast<float>(1.0 - c.beta1);
  a.s.beta2 = static_cast<float>(c.beta2);
  a.s.one_minus_beta2 = static_cast<float>(1.0 - c.beta2);
  a.s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  a.s.eps = static_cast<float>(c.eps);
  a.s.neg_step_size = static_cast<float>(-step_size);
  a.s.maximize = c.maximize;
  a.s.l2 = !adamw && c.weight_decay != 0.0;
  a.s.decoupled = adamw && a.s.decay != 1.0f;
  return a;
}

AdagradArgs MakeAdagrad(const OptimizerConfig& c, int64_t step, const FusedStepBuffers& b,
                        const RangeArgs& range) {
  AdagradArgs a;
  std::memset(&a, 0, sizeof(a));
  a.grads = MakeGradArgs(b);
  a.range = range;
  a.params = b.params;
  a.sum = b.slots[0];
  a.params_bf16 = b.params_bf16;
  const double clr = c.lr / (1.0 + (TorchStep(step) - 1.0) * c.lr_decay);
  a.s.weight_decay = static_cast<float>(c.weight_decay);
  a.s.eps = static_cast<float>(c.eps);
  a.s.neg_clr = static_cast<float>(-clr);
  a.s.maximize = c.maximize;
  a.s.has_weight_decay = c.weight_decay != 0.0;
  return a;
}

LionArgs MakeLion(const OptimizerConfig& c, const FusedStepBuffers& b, const RangeArgs& range) {
  LionArgs a;
  std::memset(&a, 0, sizeof(a));
  a.grads = MakeGradArgs(b);
  a.range = range;
  a.params = b.params;
  a.exp_avg = b.slots[0];
  a.params_bf16 = b.params_bf16;
  // As server/optim/lion.cc computes them.
  a.s.decay = static_cast<float>(1.0 - c.lr * c.weight_decay);
  a.s.beta1 = static_cast<float>(c.beta1);
  a.s.one_minus_beta1 = static_cast<float>(1.0 - c.beta1);
  a.s.beta2 = static_cast<float>(c.beta2);
  a.s.one_minus_beta2 = static_cast<float>(1.0 - c.beta2);
  a.s.neg_lr = static_cast<float>(-c.lr);
  a.s.maximize = c.maximize;
  a.s.has_weight_decay = c.weight_decay != 0.0;
  return a;
}

}  // namespace

std::string FusedStepPlan::DebugString() const {
  return absl::StrFormat("%s head=%d groups=%d tail=%d slots=%d", vectorized ? "float4" : "scalar",
                         head, vector_groups, tail, state_slots);
}

absl::StatusOr<FusedStepPlan> PlanFusedStep(const OptimizerConfig& config, int64_t step, size_t n,
                                            const FusedStepBuffers& buffers) {
  absl::StatusOr<Validated> v = Validate(config, step, n, buffers);
  if (!v.ok()) return v.status();
  return v->plan;
}

absl::Status FusedOptimizerStep(const OptimizerConfig& config, int64_t step, size_t n,
                                const FusedStepBuffers& buffers, void* stream) {
  absl::StatusOr<Validated> v = Validate(config, step, n, buffers);
  if (!v.ok()) return v.status();
  if (n == 0) return absl::OkStatus();
  cudaError_t err = cudaSuccess;
  const char* what = "";
  switch (config.kind) {
    case OptimizerKind::kSgd:
      what = "fused SGD step kernel launch";
      err = internal::LaunchSgd(MakeSgd(config, step, buffers, v->range), AsStream(stream));
      break;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      what = "fused Adam/AdamW step kernel launch";
      err = internal::LaunchAdam(MakeAdam(config, step, buffers, v->range), AsStream(stream));
      break;
    case OptimizerKind::kAdagrad:
      what = "fused Adagrad step kernel launch";
      err = internal::LaunchAdagrad(MakeAdagrad(config, step, buffers, v->range), AsStream(stream));
      break;
    case OptimizerKind::kLion:
      what = "fused Lion step kernel launch";
      err = internal::LaunchLion(MakeLion(config, buffers, v->range), AsStream(stream));
      break;
    case OptimizerKind::kLamb:
    case OptimizerKind::kAdafactor:
    case OptimizerKind::kMuon:
      return absl::UnimplementedError("no fused kernel yet");  // (Refused by Validate.)
  }
  return CudaStatus(err, what);
}

absl::Status InitializeOptimizerState(const OptimizerConfig& config, size_t n,
                                      const std::array<float*, 3>& slots, void* stream) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  const int count = config.StateSlotsPerElement();
  if (n == 0) return absl::OkStatus();
  for (int k = 0; k < count; ++k) {
    if (slots[k] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(OptimizerKindName(config.kind), " needs slot ",
                                                     k, " (", SlotName(config.kind, k),
                                                     "), which is null"));
    }
    const float value = config.kind == OptimizerKind::kAdagrad
                            ? static_cast<float>(config.initial_accumulator_value)
                            : 0.0f;
    SHARDOPT_CUDA_RETURN_IF_ERROR(internal::LaunchFill(slots[k], value, n, AsStream(stream)));
  }
  return absl::OkStatus();
}

absl::Status ConvertToBf16(const float* src, uint16_t* dst, size_t n, void* stream) {
  if (n == 0) return absl::OkStatus();
  if (src == nullptr || dst == nullptr) {
    return absl::InvalidArgumentError("ConvertToBf16: null buffer");
  }
  if (Address(src) % alignof(float) != 0 || Address(dst) % alignof(uint16_t) != 0) {
    return absl::InvalidArgumentError("ConvertToBf16: misaligned buffer");
  }
  const float* floats[1] = {src};
  const RangeArgs range = PlanRange(n, floats, 1, dst);
  SHARDOPT_CUDA_RETURN_IF_ERROR(internal::LaunchConvertToBf16(src, dst, range, AsStream(stream)));
  return absl::OkStatus();
}

uint16_t Fp32ToBf16Bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return internal::Fp32BitsToBf16Bits(u);
}

}  // namespace gpu
}  // namespace shardopt
