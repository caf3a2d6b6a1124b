#include "tests/support/synthetic.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/loss_scaler.h"
#include "common/dtype_convert.h"
#include "server/optim/optimizer.h"

namespace shardopt::testing {
namespace {

// SplitMix64: a well-mixed hash of the element's coordinates.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1), exactly representable in fp32.
float UnitNoise(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  const uint64_t h = Mix(Mix(Mix(Mix(a) ^ b) ^ c) ^ d);
  return static_cast<float>(static_cast<int64_t>(h >> 40) - (int64_t{1} << 23)) /
         static_cast<float>(int64_t{1} << 23);
}

}  // namespace

absl::StatusOr<OptimizerConfig> OptimizerByName(const std::string& name) {
  if (name == "sgd") return OptimizerConfig::Sgd(0.05);
  if (name == "sgd_momentum") {
    OptimizerConfig c = OptimizerConfig::Sgd(0.05);
    c.momentum = 0.9;
    c.dampening = 0.1;
    c.weight_decay = 1e-3;
    return c;
  }
  if (name == "sgd_nesterov") {
    OptimizerConfig c = OptimizerConfig::Sgd(0.05);
    c.momentum = 0.9;
    c.nesterov = true;
    return c;
  }
  if (name == "adam") return OptimizerConfig::Adam(1e-2);
  if (name == "adam_l2") {
    OptimizerConfig c = OptimizerConfig::Adam(1e-2);
    c.weight_decay = 1e-2;
    return c;
  }
  if (name == "adamw") return OptimizerConfig::AdamW(1e-2);
  if (name == "adamw_amsgrad") {
    OptimizerConfig c = OptimizerConfig::AdamW(1e-2);
    c.amsgrad = true;
    return c;
  }
  if (name == "adagrad") {
    OptimizerConfig c = OptimizerConfig::Adagrad(0.1);
    c.lr_decay = 1e-3;
    c.initial_accumulator_value = 0.1;
    return c;
  }
  if (name == "lion") {
    OptimizerConfig c = OptimizerConfig::Lion(3e-3);
    c.weight_decay = 0.1;
    return c;
  }
  if (name == "lamb") return OptimizerConfig::Lamb(1e-2);
  if (name == "muon") return OptimizerConfig::Muon(2e-2);
  if (name == "adafactor") {
    OptimizerConfig c = OptimizerConfig::Adafactor(5e-2);
    c.weight_decay = 0.01;
    return c;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown optimizer name '", name, "'"));
}

ModelSpec SyntheticModelSpec(const std::string& model_id, const OptimizerConfig& optimizer,
                             uint32_t num_trainers) {
  ModelSpec spec;
  spec.model_id = model_id;
  spec.tensors = {
      {"embed.weight", {37, 19}, DType::kFloat32}, {"layer1.weight", {19, 23}, DType::kFloat32},
      {"layer1.bias", {23}, DType::kFloat32},      {"layer2.weight", {23, 5}, DType::kFloat32},
      {"layer2.bias", {5}, DType::kFloat32},       {"temperature", {}, DType::kFloat32},
  };
  if (optimizer.kind == OptimizerKind::kMuon) {
    // Muon takes matrices only (the vectors would be an AdamW model's).
    std::vector<TensorSpec> matrices;
    for (const TensorSpec& t : spec.tensors) {
      if (t.shape.size() == 2) matrices.push_back(t);
    }
    spec.tensors = std::move(matrices);
  }
  // (LAMB's norm blocks of 64 elements must not straddle shards when it runs
  // on the flat partition: see CheckTrustNormsFit.)
  spec.alignment = optimizer.kind == OptimizerKind::kLamb ? 64 : 16;
  // LAMB, Adafactor and Muon on whole tensors (LAMB runs flat too, with
  // --partition=flat); the others keep the flat split.
  spec.partition = NeedsWholeTensors(optimizer.kind) ? Partition::kWholeTensors : Partition::kFlat;
  spec.optimizer = optimizer;
  spec.num_trainers = num_trainers;
  return spec;
}

// Keyed by (tensor, element), not by flat offset: every layout of the model
// (shard count, partition) gets the same values per tensor element, so a
// job restored onto another partition continues the same computation.
std::vector<float> SyntheticInitialParams(const ModelLayout& layout, uint64_t seed) {
  std::vector<float> params(layout.total_elements(), 0.0f);
  for (size_t ti = 0; ti < layout.tensors().size(); ++ti) {
    const TensorPlacement& t = layout.tensors()[ti];
    for (uint64_t i = 0; i < t.size; ++i) {
      params[t.offset + i] = 0.5f * UnitNoise(seed, 0xA11, ti, i);
    }
  }
  return params;
}

std::vector<float> DyadicInitialParams(const ModelLayout& layout, uint64_t seed) {
  std::vector<float> params(layout.total_elements(), 0.0f);
  for (const TensorPlacement& t : layout.tensors()) {
    for (uint64_t i = 0; i < t.size; ++i) {
      // UnitNoise is in [-1, 1): 1023 steps of 2^-10 either side.
      params[t.offset + i] = std::round(1023.0f * UnitNoise(seed, 0xD1AD, t.offset, i)) / 1024.0f;
    }
  }
  return params;
}

void DyadicGradient(const ModelLayout& layout, uint32_t rank, int64_t step, uint64_t seed,
                    absl::Span<float> grad) {
  std::fill(grad.begin(), grad.end(), 0.0f);
  for (const TensorPlacement& t : layout.tensors()) {
    for (uint64_t i = 0; i < t.size; ++i) {
      const uint64_t flat = t.offset + i;
      grad[flat] =
          std::round(8.0f * UnitNoise(seed ^ rank, static_cast<uint64_t>(step), flat, 5)) / 64.0f;
    }
  }
}

std::vector<float> DyadicSgdResult(const ModelLayout& layout, uint32_t trainers, int64_t steps,
                                   uint64_t seed, double lr,
                                   const std::set<std::pair<uint32_t, int64_t>>& left_out) {
  const std::vector<float> p0 = DyadicInitialParams(layout, seed);
  std::vector<double> sum(p0.size(), 0.0);
  std::vector<float> grad(p0.size());
  for (uint32_t r = 0; r < trainers; ++r) {
    for (int64_t k = 1; k <= steps; ++k) {
      if (left_out.count({r, k}) > 0) continue;
      DyadicGradient(layout, r, k, seed, absl::MakeSpan(grad));
      for (size_t i = 0; i < sum.size(); ++i) sum[i] += grad[i];
    }
  }
  std::vector<float> out(p0.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(p0[i] - lr * sum[i]);
  return out;
}

void SyntheticGradient(const ModelLayout& layout, absl::Span<const float> params, uint32_t rank,
                       int64_t step, uint64_t seed, absl::Span<float> grad) {
  std::fill(grad.begin(), grad.end(), 0.0f);
  for (size_t ti = 0; ti < layout.tensors().size(); ++ti) {
    const TensorPlacement& t = layout.tensors()[ti];
    for (uint64_t i = 0; i < t.size; ++i) {
      const uint64_t flat = t.offset + i;
      const float target = 0.25f * UnitNoise(seed, 0x7A6, ti, i);
      const float noise =
          0.1f * UnitNoise(seed ^ rank, static_cast<uint64_t>(step), (uint64_t{ti} << 40) + i, 3);
      grad[flat] = 0.5f * params[flat] - target + noise + 0.01f * static_cast<float>(rank);
    }
  }
}

void RoundTo(DType dtype, absl::Span<float> values) {
  if (dtype == DType::kFloat32) return;
  std::vector<uint16_t> narrow(values.size());
  ConvertFromFloat(values.data(), values.size(), dtype, narrow.data());
  ConvertToFloatAndFindNonFinite(narrow.data(), values.size(), dtype, values.data());
}

namespace {

// The shards' global norm: per shard, 65536-element blocks summed in order.
double GlobalSumOfSquares(const ModelLayout& layout, const std::vector<float>& g, float scale) {
  constexpr uint64_t kBlock = 1 << 16;
  double total = 0;
  for (uint32_t s = 0; s < layout.shard_count(); ++s) {
    const FlatRange range = layout.ShardRange(s);
    double shard_total = 0;
    for (uint64_t b = range.begin; b < range.end; b += kBlock) {
      double block = 0;
      for (uint64_t i = b; i < std::min(range.end, b + kBlock); ++i) {
        const double x = static_cast<double>(g[i] * scale);
        block += x * x;
      }
      shard_total += block;
    }
    total += shard_total;
  }
  return total;
}

}  // namespace

std::vector<float> ReferenceRun(const ModelSpec& spec, const ModelLayout& layout, int steps,
                                uint64_t seed, const ReferenceOptions& options) {
  const DType push_dtype = options.push_dtype, pull_dtype = options.pull_dtype;
  OptimizerConfig base = spec.optimizer;
  LrSchedule schedule = spec.lr_schedule;
  const bool control = spec.max_grad_norm > 0 || spec.loss_scaling;
  LossScaler scaler(spec.loss_scaler);
  std::vector<float> params = SyntheticInitialParams(layout, seed);
  // The whole buffer as one range: every tensor whole (for LAMB, Adafactor).
  std::vector<RangeTensor> tensors;
  for (const TensorPlacement& t : layout.tensors()) {
    tensors.push_back(RangeTensor{t.offset, t.size, t.spec.shape});
  }
  std::unique_ptr<Optimizer> optimizer =
      std::move(Optimizer::Create(spec.optimizer, params.size(), std::move(tensors)).value());
  std::vector<float> sum(params.size()), grad(params.size()), visible(params.size());
  int64_t optimizer_step = 0;
  for (int64_t step = 1; step <= steps; ++step) {
    if (auto change = options.changes.find(step); change != options.changes.end()) {
      base = change->second.first;
      schedule = change->second.second;
    }
    OptimizerConfig config = base;
    config.lr = schedule.LearningRate(base.lr, step);
    if (absl::Status s = optimizer->SetConfig(config); !s.ok()) {
      fprintf(stderr, "ReferenceRun: step %ld: %s\n", static_cast<long>(step),
              s.ToString().c_str());
      abort();  // A reference that silently ignores a change would prove nothing.
    }
    const float loss_scale = spec.loss_scaling ? static_cast<float>(scaler.scale()) : 1.0f;
    visible = params;
    RoundTo(pull_dtype, absl::MakeSpan(visible));
    bool found_inf = false;
    for (uint32_t r = 0; r < spec.num_trainers; ++r) {
      absl::Span<float> out = r == 0 ? absl::MakeSpan(sum) : absl::MakeSpan(grad);
      SyntheticGradient(layout, visible, r, step, seed, out);
      if (spec.loss_scaling) {
        for (float& v : out) v *= loss_scale;
      }
      if (r == 0 && options.plant_inf_steps.count(step) > 0) {
        out[options.plant_inf_element] = step % 2 == 1 ? std::numeric_limits<float>::infinity()
                                                       : std::numeric_limits<float>::quiet_NaN();
      }
      RoundTo(push_dtype, out);
      for (float v : out) found_inf = found_inf || !std::isfinite(v);
      if (r > 0) {
        for (size_t i = 0; i < sum.size(); ++i) sum[i] += grad[i];
      }
    }
    if (spec.reduction == GradientReduction::kMean && spec.num_trainers > 1) {
      const float divisor = static_cast<float>(spec.num_trainers);
      for (float& v : sum) v /= divisor;
    }
    if (!control) {
      optimizer->Update(step, params.data(), sum.data(), 0, params.size());
      continue;
    }
    const float inverse_scale =
        static_cast<float>(1.0 / (spec.loss_scaling ? scaler.scale() : 1.0));
    const double total = found_inf ? 0 : GlobalSumOfSquares(layout, sum, inverse_scale);
    if (found_inf || !std::isfinite(total)) {
      if (options.skipped_steps != nullptr) options.skipped_steps->push_back(step);
      scaler.Update(true);
      continue;
    }
    double coef = 1.0;
    if (spec.max_grad_norm > 0) {
      const double c = spec.max_grad_norm / (std::sqrt(total) + 1e-6);
      if (c < 1.0) coef = c;
    }
    const float multiplier = static_cast<float>(coef) * inverse_scale;
    if (multiplier != 1.0f) {
      for (float& v : sum) v *= multiplier;
    }
    optimizer->Update(++optimizer_step, params.data(), sum.data(), 0, params.size());
    scaler.Update(false);
  }
  return params;
}

absl::Status WriteFloats(const std::string& path, absl::Span<const float> values) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(values.data()),
            static_cast<std::streamsize>(values.size() * sizeof(float)));
  if (!out.good()) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> ReadFloats(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in.good()) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  const std::streamsize bytes = in.tellg();
  in.seekg(0);
  std::vector<float> values(static_cast<size_t>(bytes) / sizeof(float));
  in.read(reinterpret_cast<char*>(values.data()), bytes);
  return values;
}

std::vector<float> ConstantGradient(const ModelLayout& layout, float value) {
  std::vector<float> grad(layout.total_elements(), 0.0f);
  for (const TensorPlacement& t : layout.tensors()) {
    std::fill(grad.begin() + t.offset, grad.begin() + t.offset + t.size, value);
  }
  return grad;
}

}  // namespace shardopt::testing
