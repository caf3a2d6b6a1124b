#include "common/optimizer_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace shardopt {

const char* OptimizerKindName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kAdam:
      return "adam";
    case OptimizerKind::kAdamW:
      return "adamw";
    case OptimizerKind::kAdagrad:
      return "adagrad";
    case OptimizerKind::kLion:
      return "lion";
    case OptimizerKind::kLamb:
      return "lamb";
    case OptimizerKind::kAdafactor:
      return "adafactor";
    case OptimizerKind::kMuon:
      return "muon";
  }
  return "unknown";
}

bool NeedsWholeTensors(OptimizerKind kind) {
  return kind == OptimizerKind::kLamb || kind == OptimizerKind::kAdafactor ||
         kind == OptimizerKind::kMuon;
}

absl::Status CheckOptimizerFitsTensor(OptimizerKind kind, const std::string& name,
                                      const std::vector<int64_t>& shape) {
  if (kind == OptimizerKind::kMuon && shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("muon updates 2-D tensors only (as torch.optim.Muon): tensor '", name,
                     "' has ", shape.size(),
                     " dimensions; train it in a model of its own with AdamW (in "
                     "shardopt.torch: a parameter group with optimizer='adamw')"));
  }
  return absl::OkStatus();
}

absl::Status CheckOptimizerFitsPartition(OptimizerKind kind, bool whole_tensor_partition) {
  // (LAMB gathers its norms over shards instead: CheckTrustNormsFit.)
  if (NeedsWholeTensors(kind) && kind != OptimizerKind::kLamb && !whole_tensor_partition) {
    return absl::InvalidArgumentError(
        absl::StrCat(OptimizerKindName(kind),
                     " updates each tensor from the whole tensor's values: it needs the partition "
                     "whole_tensors (Layout.partition = PARTITION_WHOLE_TENSORS), not flat"));
  }
  return absl::OkStatus();
}

OptimizerConfig OptimizerConfig::Sgd(double lr) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kSgd;
  c.lr = lr;
  return c;
}

OptimizerConfig OptimizerConfig::Adam(double lr) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdam;
  c.lr = lr;
  return c;
}

OptimizerConfig OptimizerConfig::AdamW(double lr) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdamW;
  c.lr = lr;
  c.weight_decay = 1e-2;
  return c;
}

OptimizerConfig OptimizerConfig::Adagrad(double lr) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdagrad;
  c.lr = lr;
  c.eps = 1e-10;
  return c;
}

OptimizerConfig OptimizerConfig::Lion(double lr) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kLion;
  c.lr = lr;
  c.beta1 = 0.9;
  c.beta2 = 0.99;
  return c;
}

OptimizerConfig OptimizerConfig::Lamb(double lr) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kLamb;
  c.lr = lr;
  c.eps = 1e-6;
  c.weight_decay = 0.01;
  return c;
}

OptimizerConfig OptimizerConfig::Adafactor(double lr) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kAdafactor;
  c.lr = lr;
  return c;
}

OptimizerConfig OptimizerConfig::Muon(double lr) {
  OptimizerConfig c;
  c.kind = OptimizerKind::kMuon;
  c.lr = lr;
  c.weight_decay = 0.1;
  c.momentum = 0.95;
  c.nesterov = true;
  c.eps = 1e-7;
  return c;
}

std::vector<std::string> OptimizerConfig::StateSlotNames() const {
  switch (kind) {
    case OptimizerKind::kSgd:
      if (momentum != 0.0) return {"momentum_buffer"};
      return {};
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      if (amsgrad) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
      return {"exp_avg", "exp_avg_sq"};
    case OptimizerKind::kAdagrad:
      return {"sum"};
    case OptimizerKind::kLion:
      return {"exp_avg"};
    case OptimizerKind::kLamb:
      return {"exp_avg", "exp_avg_sq"};
    case OptimizerKind::kAdafactor:
      return {"row_var", "col_var"};
    case OptimizerKind::kMuon:
      return {"momentum_buffer"};
  }
  return {};
}

bool OptimizerConfig::PacksSlot(int slot) const {
  return kind == OptimizerKind::kAdafactor && slot >= 0 && slot < 2;
}

uint64_t OptimizerConfig::StoredSlotElements(int slot, const std::vector<int64_t>& shape,
                                             uint64_t size) const {
  if (!PacksSlot(slot)) return size;
  if (shape.size() < 2) return slot == 0 ? size : 0;
  const uint64_t rows = static_cast<uint64_t>(shape[shape.size() - 2]);
  const uint64_t cols = static_cast<uint64_t>(shape.back());
  if (rows == 0 || cols == 0) return 0;
  return slot == 0 ? size / cols : size / rows;
}

std::optional<OptimizerConfig::TorchStateTensor> OptimizerConfig::TorchStateOf(
    int slot, const std::vector<int64_t>& shape) const {
  std::vector<std::string> names = StateSlotNames();
  if (slot < 0 || slot >= static_cast<int>(names.size())) return std::nullopt;
  if (!PacksSlot(slot)) return TorchStateTensor{names[slot], shape};
  if (shape.size() < 2) {
    if (slot != 0) return std::nullopt;
    return TorchStateTensor{"variance", shape};
  }
  std::vector<int64_t> factor = shape;
  factor[shape.size() - (slot == 0 ? 1 : 2)] = 1;
  return TorchStateTensor{names[slot], std::move(factor)};
}

float OptimizerConfig::InitialSlotValue(int slot) const {
  (void)slot;
  return kind == OptimizerKind::kAdagrad ? static_cast<float>(initial_accumulator_value) : 0.0f;
}

int OptimizerConfig::StateSlotsPerElement() const {
  switch (kind) {
    case OptimizerKind::kSgd:
      return momentum != 0.0 ? 1 : 0;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      return amsgrad ? 3 : 2;
    case OptimizerKind::kAdagrad:
    case OptimizerKind::kLion:
    case OptimizerKind::kMuon:
      return 1;
    case OptimizerKind::kLamb:
    case OptimizerKind::kAdafactor:
      return 2;
  }
  return 0;
}

bool OptimizerConfig::operator==(const OptimizerConfig& o) const {
  return kind == o.kind && lr == o.lr && weight_decay == o.weight_decay && maximize == o.maximize &&
         momentum == o.momentum && dampening == o.dampening && nesterov == o.nesterov &&
         beta1 == o.beta1 && beta2 == o.beta2 && amsgrad == o.amsgrad && eps == o.eps &&
         lr_decay == o.lr_decay && initial_accumulator_value == o.initial_accumulator_value &&
         min_trust_ratio == o.min_trust_ratio && max_trust_ratio == o.max_trust_ratio &&
         bias_correction == o.bias_correction && beta2_decay == o.beta2_decay && eps1 == o.eps1 &&
         eps2 == o.eps2 && clip_threshold == o.clip_threshold && ns_a == o.ns_a && ns_b == o.ns_b &&
         ns_c == o.ns_c && ns_steps == o.ns_steps && adjust_lr == o.adjust_lr;
}

absl::Status OptimizerConfig::CheckCanChangeTo(const OptimizerConfig& next) const {
  if (next.kind != kind) {
    return absl::FailedPreconditionError(absl::StrCat("cannot change the optimizer from ",
                                                      OptimizerKindName(kind), " to ",
                                                      OptimizerKindName(next.kind)));
  }
  if (next.amsgrad != amsgrad) {
    return absl::FailedPreconditionError("cannot turn amsgrad on or off on a live model");
  }
  if (kind == OptimizerKind::kSgd && (next.momentum != 0.0) != (momentum != 0.0)) {
    return absl::FailedPreconditionError(
        "cannot switch SGD momentum between zero and non-zero on a live model");
  }
  return absl::OkStatus();
}

namespace {

absl::Status NonNegative(const char* name, double value) {
  if (!(value >= 0.0) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid ", name, ": ", value, " (must be finite and >= 0)"));
  }
  return absl::OkStatus();
}

absl::Status Beta(const char* name, double value) {
  if (!(value >= 0.0 && value < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid ", name, ": ", value, " (must be in [0, 1))"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status OptimizerConfig::Validate() const {
  if (absl::Status s = NonNegative("lr", lr); !s.ok()) return s;
  if (absl::Status s = NonNegative("weight_decay", weight_decay); !s.ok()) return s;
  switch (kind) {
    case OptimizerKind::kSgd:
      if (absl::Status s = NonNegative("momentum", momentum); !s.ok()) return s;
      if (absl::Status s = NonNegative("dampening", dampening); !s.ok()) return s;
      if (nesterov && (momentum <= 0.0 || dampening != 0.0)) {
        return absl::InvalidArgumentError(
            "nesterov momentum requires a momentum and zero dampening");
      }
      return absl::OkStatus();
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      if (absl::Status s = Beta("beta1", beta1); !s.ok()) return s;
      if (absl::Status s = Beta("beta2", beta2); !s.ok()) return s;
      return NonNegative("eps", eps);
    case OptimizerKind::kAdagrad:
      if (absl::Status s = NonNegative("lr_decay", lr_decay); !s.ok()) return s;
      if (absl::Status s = NonNegative("initial_accumulator_value", initial_accumulator_value);
          !s.ok()) {
        return s;
      }
      return NonNegative("eps", eps);
    case OptimizerKind::kLion:
      if (absl::Status s = Beta("beta1", beta1); !s.ok()) return s;
      return Beta("beta2", beta2);
    case OptimizerKind::kLamb:
      if (absl::Status s = Beta("beta1", beta1); !s.ok()) return s;
      if (absl::Status s = Beta("beta2", beta2); !s.ok()) return s;
      if (absl::Status s = NonNegative("eps", eps); !s.ok()) return s;
      if (absl::Status s = NonNegative("min_trust_ratio", min_trust_ratio); !s.ok()) return s;
      if (absl::Status s = NonNegative("max_trust_ratio", max_trust_ratio); !s.ok()) return s;
      if (max_trust_ratio != 0.0 && min_trust_ratio > max_trust_ratio) {
        return absl::InvalidArgumentError(absl::StrCat(
            "min_trust_ratio ", min_trust_ratio, " is above max_trust_ratio ", max_trust_ratio));
      }
      return absl::OkStatus();
    case OptimizerKind::kAdafactor:
      // torch.optim.Adafactor's checks.
      if (!(beta2_decay <= 0.0) || !std::isfinite(beta2_decay)) {
        return absl::InvalidArgumentError(
            absl::StrCat("invalid beta2_decay: ", beta2_decay, " (must be finite and <= 0)"));
      }
      if (eps1 >= 0.0 || !std::isfinite(eps1)) {
        if (absl::Status s = NonNegative("eps1", eps1); !s.ok()) return s;
      }
      if (absl::Status s = NonNegative("eps2", eps2); !s.ok()) return s;
      if (!(clip_threshold >= 1.0) || !std::isfinite(clip_threshold)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "invalid clipping threshold d: ", clip_threshold, " (must be finite and >= 1)"));
      }
      return absl::OkStatus();
    case OptimizerKind::kMuon:
      // torch.optim.Muon's checks, and the coefficients finite.
      if (absl::Status s = NonNegative("momentum", momentum); !s.ok()) return s;
      if (absl::Status s = NonNegative("eps", eps); !s.ok()) return s;
      if (ns_steps < 1 || ns_steps >= 100) {
        return absl::InvalidArgumentError(
            absl::StrCat("ns_steps ", ns_steps, " is not in [1, 100)"));
      }
      if (!std::isfinite(ns_a) || !std::isfinite(ns_b) || !std::isfinite(ns_c)) {
        return absl::InvalidArgumentError("the Newton-Schulz coefficients must be finite");
      }
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError("unknown optimizer kind");
}

std::string OptimizerConfig::DebugString() const {
  std::string s =
      absl::StrFormat("%s(lr=%g, weight_decay=%g", OptimizerKindName(kind), lr, weight_decay);
  switch (kind) {
    case OptimizerKind::kSgd:
      absl::StrAppendFormat(&s, ", momentum=%g, dampening=%g, nesterov=%d", momentum, dampening,
                            nesterov);
      break;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      absl::StrAppendFormat(&s, ", betas=(%g, %g), eps=%g, amsgrad=%d", beta1, beta2, eps, amsgrad);
      break;
    case OptimizerKind::kAdagrad:
      absl::StrAppendFormat(&s, ", lr_decay=%g, initial_accumulator_value=%g, eps=%g", lr_decay,
                            initial_accumulator_value, eps);
      break;
    case OptimizerKind::kLion:
      absl::StrAppendFormat(&s, ", betas=(%g, %g)", beta1, beta2);
      break;
    case OptimizerKind::kLamb:
      absl::StrAppendFormat(&s,
                            ", betas=(%g, %g), eps=%g, trust_ratio=[%g, %g], bias_correction=%d",
                            beta1, beta2, eps, min_trust_ratio, max_trust_ratio, bias_correction);
      break;
    case OptimizerKind::kAdafactor:
      if (eps1 < 0) {
        absl::StrAppendFormat(&s, ", beta2_decay=%g, eps=(None, %g), d=%g", beta2_decay, eps2,
                              clip_threshold);
      } else {
        absl::StrAppendFormat(&s, ", beta2_decay=%g, eps=(%g, %g), d=%g", beta2_decay, eps1, eps2,
                              clip_threshold);
      }
      break;
    case OptimizerKind::kMuon:
      absl::StrAppendFormat(&s, ", momentum=%g, nesterov=%d, ns=(%g, %g, %g) x%d, eps=%g, %s",
                            momentum, nesterov, ns_a, ns_b, ns_c, ns_steps, eps,
                            adjust_lr == MuonAdjustLr::kOriginal ? "original" : "match_rms_adamw");
      break;
  }
  if (maximize) s += ", maximize=1";
  s += ")";
  return s;
}

}  // namespace shardopt
