// Internal to //server/optim: the per-family factories behind
// Optimizer::Create and the helpers the kernels share. Not a public API.
#ifndef SHARDOPT_SERVER_OPTIM_OPTIMIZER_INTERNAL_H_
#define SHARDOPT_SERVER_OPTIM_OPTIMIZER_INTERNAL_H_

#include <cassert>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include "common/optimizer_config.h"
#include "server/optim/optimizer.h"

namespace shardopt {
namespace optim_internal {

// On the element-wise kernels: GCC also builds an AVX2 copy and picks one
// when the program loads (an ifunc; GCC on glibc only). The division- and
// square-root-bound loops (Adam, Adagrad) run about 1.4x faster in 8 lanes
// than in SSE2's 4. The results do not change: "avx2" does not include FMA,
// KERNEL_COPTS turn contraction off, and each lane does the scalar code's
// IEEE operations in its order. torch_parity_test checks the copy this
// machine picks against PyTorch bit for bit; torch_parity_baseline_test and
// optimizer_reference_baseline_test build the kernels without clones, so
// the default code is checked too.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__GLIBC__) && \
    !defined(__CUDACC__) && !defined(SHARDOPT_NO_VECTOR_CLONES)
#define SHARDOPT_ELEMENTWISE_KERNEL __attribute__((target_clones("avx2", "default")))
#else
#define SHARDOPT_ELEMENTWISE_KERNEL
#endif

// Factories; `config` has passed Validate() and has the matching kind.
std::unique_ptr<Optimizer> NewSgd(const OptimizerConfig& config, size_t size);
std::unique_ptr<Optimizer> NewAdam(const OptimizerConfig& config, size_t size);  // and AdamW
std::unique_ptr<Optimizer> NewAdagrad(const OptimizerConfig& config, size_t size);
std::unique_ptr<Optimizer> NewLion(const OptimizerConfig& config, size_t size);
std::unique_ptr<Optimizer> NewLamb(const OptimizerConfig& config, size_t size);
std::unique_ptr<Optimizer> NewAdafactor(const OptimizerConfig& config, size_t size);
std::unique_ptr<Optimizer> NewMuon(const OptimizerConfig& config, size_t size);

// The sum of x[i]^2 over [0, n) in double, in kSumLanes interleaved partial
// sums added up in lane order, then the tail: it depends only on the values
// and n (not on threads or on how a caller splits work elsewhere), and the
// lanes are independent chains, so it vectorises without reassociation.
inline constexpr size_t kSumLanes = 8;
inline double SumOfSquares(const float* x, size_t n) {
  double lanes[kSumLanes] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    for (size_t j = 0; j < kSumLanes; ++j) {
      const double v = x[i + j];
      lanes[j] += v * v;
    }
  }
  double sum = 0;
  for (size_t j = 0; j < kSumLanes; ++j) sum += lanes[j];
  for (; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

// Elements the whole-tensor kernels compute into a scratch block at a time
// (an L1-sized piece of the update, reduced before the next).
inline constexpr size_t kScratchElements = 2048;

// torch.lerp for floats: self + w * (end - self) for |w| < 0.5, else
// end - (end - self) * (1 - w).
inline float TorchLerp(float self, float end, float weight) {
  return std::fabs(weight) < 0.5f ? self + weight * (end - self)
                                  : end - (end - self) * (1.0f - weight);
}

// The base of the whole-tensor optimizers (LAMB, Adafactor, Muon): they
// implement UpdateTensor; Update runs it on every tensor that begins in
// [begin, end) (each must end by `end`).
class WholeTensorOptimizer : public Optimizer {
 public:
  bool needs_whole_tensors() const final { return true; }
  void Update(int64_t step, float* params, const float* grad, size_t begin, size_t end) final {
    assert(begin <= end && end <= size());
    for (size_t t = 0; t < tensors().size(); ++t) {
      if (tensors()[t].offset < begin || tensors()[t].offset >= end) continue;
      assert(tensors()[t].offset + tensors()[t].size <= end);
      UpdateTensor(step, params, grad, t);
    }
  }

 protected:
  using Optimizer::Optimizer;
};

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
