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
  }
  return "unknown";
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
  }
  return {};
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
      return 1;
  }
  return 0;
}

bool OptimizerConfig::operator==(const OptimizerConfig& o) const {
  return kind == o.kind && lr == o.lr && weight_decay == o.weight_decay && maximize == o.maximize &&
         momentum == o.momentum && dampening == o.dampening && nesterov == o.nesterov &&
         beta1 == o.beta1 && beta2 == o.beta2 && amsgrad == o.amsgrad && eps == o.eps &&
         lr_decay == o.lr_decay && initial_accumulator_value == o.initial_accumulator_value;
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
  if ((next.momentum != 0.0) != (momentum != 0.0)) {
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
  }
  if (maximize) s += ", maximize=1";
  s += ")";
  return s;
}

}  // namespace shardopt
