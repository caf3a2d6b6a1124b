// Internal to //server/optim: the per-family factories behind
// Optimizer::Create and the helpers the kernels share. Not a public API.
#ifndef SHARDOPT_SERVER_OPTIM_OPTIMIZER_INTERNAL_H_
#define SHARDOPT_SERVER_OPTIM_OPTIMIZER_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include "common/optimizer_config.h"
#include "server/optim/optimizer.h"

namespace shardopt {
namespace optim_internal {

// Factories; `config` has passed Validate() and has the matching kind.
std::unique_ptr<Optimizer> NewSgd(const OptimizerConfig& config, size_t size);
std::unique_ptr<Optimizer> NewAdam(const OptimizerConfig& config, size_t size);  // and AdamW
std::unique_ptr<Optimizer> NewAdagrad(const OptimizerConfig& config, size_t size);
std::unique_ptr<Optimizer> NewLion(const OptimizerConfig& config, size_t size);

// The step count as torch.optim 1.13 sees it. PyTorch keeps state['step'] in
// a float32 tensor and increments it with `step_t += 1`, so it stops growing
// at 2^24 (2^24 + 1 rounds back to 2^24); step-dependent scalars use that.
inline double TorchStep(int64_t step) {
  constexpr int64_t kFloatStepLimit = int64_t{1} << 24;
  return static_cast<double>(step < kFloatStepLimit ? step : kFloatStepLimit);
}

// Calls f(std::integral_constant<bool, b>{}) so that a runtime flag becomes a
// template argument and the branch leaves the inner loop.
template <typename F>
decltype(auto) DispatchBool(bool b, F&& f) {
  if (b) return std::forward<F>(f)(std::true_type{});
  return std::forward<F>(f)(std::false_type{});
}

// torch.maximum for floats: NaN if either argument is NaN, else the larger.
// Written as a select so that GCC vectorises it.
inline float TorchMaximum(float a, float b) { return (a < b || b != b) ? b : a; }

}  // namespace optim_internal
}  // namespace shardopt

#endif  // SHARDOPT_SERVER_OPTIM_OPTIMIZER_INTERNAL_H_
