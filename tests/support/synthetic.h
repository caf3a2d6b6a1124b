// Test support: a deterministic synthetic training workload, and the
// single-process reference run it must reproduce.
//
// The gradient of trainer r at step k depends on the parameters it pulled
// (g = 0.5 * p - target + noise(seed, r, k, i)), so a trainer that trained on
// stale or torn parameters ends somewhere else: comparing final parameters
// checks the whole push/reduce/update/pull loop, not just the kernels.
#ifndef SHARDOPT_TESTS_SUPPORT_SYNTHETIC_H_
#define SHARDOPT_TESTS_SUPPORT_SYNTHETIC_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/trainer_client.h"
#include "common/layout.h"
#include "common/optimizer_config.h"

namespace shardopt::testing {

// Optimizer configs by short name: "sgd", "sgd_momentum", "sgd_nesterov",
// "adam", "adam_l2", "adamw", "adamw_amsgrad", "adagrad", "lion", "lamb",
// "adafactor", "muon". INVALID_ARGUMENT otherwise.
absl::StatusOr<OptimizerConfig> OptimizerByName(const std::string& name);

// A model of odd-shaped tensors (so tensors straddle shards), named model_id;
// on the whole_tensors partition for the optimizers that need it (Muon's:
// its matrices only).
ModelSpec SyntheticModelSpec(const std::string& model_id, const OptimizerConfig& optimizer,
                             uint32_t num_trainers);

// Initial values: deterministic per (seed, element), zero in padding.
std::vector<float> SyntheticInitialParams(const ModelLayout& layout, uint64_t seed);

// Exact numbers for the asynchronous modes' tests: initial parameters that
// are multiples of 2^-10 in (-1, 1), and gradients that are multiples of
// 2^-6 in [-1/8, 1/8] and do not depend on the parameters; zero in padding.
// Plain SGD with a power-of-two lr then ends at p0 - lr * (sum of every
// push) exactly, in any order of the pushes (every partial sum is a
// multiple of 2^-10 far below 2^13).
std::vector<float> DyadicInitialParams(const ModelLayout& layout, uint64_t seed);
void DyadicGradient(const ModelLayout& layout, uint32_t rank, int64_t step, uint64_t seed,
                    absl::Span<float> grad);
// p0 - lr * (the pushes of steps 1..steps of every trainer but the
// (rank, step) pairs `left_out`, skipped steps), summed in double (exact).
std::vector<float> DyadicSgdResult(const ModelLayout& layout, uint32_t trainers, int64_t steps,
                                   uint64_t seed, double lr,
                                   const std::set<std::pair<uint32_t, int64_t>>& left_out = {});

// Trainer `rank`'s gradient for `step` given the parameters it holds.
void SyntheticGradient(const ModelLayout& layout, absl::Span<const float> params, uint32_t rank,
                       int64_t step, uint64_t seed, absl::Span<float> grad);

// Trains `spec` for `steps` steps in one process, reducing the trainers'
// gradients as the shards do (sum in rank order, then / T for the mean).
// With 16-bit wire types it also rounds as the wire does: trainers see the
// fp32 master parameters rounded to `pull_dtype` and send gradients rounded
// to `push_dtype`. Returns the flat fp32 master parameters of `layout` (any
// shard count: tensors sit at the same offsets).
// `changes[k]` replaces the optimizer and schedule from step k on (as
// SetHyperparameters does); the lr of each step comes from the schedule.
// Gradient control as the shards apply it (spec.max_grad_norm,
// spec.loss_scaling): trainers multiply gradients by the loss scale, rank 0
// plants +inf (odd steps) or NaN (even steps) in `plant_inf_element` at the
// steps in `plant_inf_steps`, a
// step with any inf/NaN is skipped, otherwise the global norm is summed the
// way the shards sum it (per shard of `layout`, in 65536-element blocks,
// shards in order) and the unscaled gradient clipped.
struct ReferenceOptions {
  DType push_dtype = DType::kFloat32;
  DType pull_dtype = DType::kFloat32;
  std::map<int64_t, std::pair<OptimizerConfig, LrSchedule>> changes;
  std::set<int64_t> plant_inf_steps;
  uint64_t plant_inf_element = 0;
  std::vector<int64_t>* skipped_steps = nullptr;  // Filled when set.
};
std::vector<float> ReferenceRun(const ModelSpec& spec, const ModelLayout& layout, int steps,
                                uint64_t seed, const ReferenceOptions& options = {});

// A flat gradient of `value` on every tensor element and zeros on the
// padding (which gets zero gradients).
std::vector<float> ConstantGradient(const ModelLayout& layout, float value);

// x -> the fp32 value of x rounded to `dtype` (identity for fp32).
void RoundTo(DType dtype, absl::Span<float> values);

// Reads / writes a flat fp32 buffer as raw bytes.
absl::Status WriteFloats(const std::string& path, absl::Span<const float> values);
absl::StatusOr<std::vector<float>> ReadFloats(const std::string& path);

}  // namespace shardopt::testing

#endif  // SHARDOPT_TESTS_SUPPORT_SYNTHETIC_H_
