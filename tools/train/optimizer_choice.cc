#include "tools/train/optimizer_choice.h"

#include "absl/strings/str_cat.h"

namespace shardopt::train {

absl::StatusOr<OptimizerConfig> ChooseOptimizer(absl::string_view name, double lr) {
  OptimizerConfig config;
  if (name == "adamw") {
    config = OptimizerConfig::AdamW(lr > 0 ? lr : 1e-2);
  } else if (name == "adam") {
    config = OptimizerConfig::Adam(lr > 0 ? lr : 1e-2);
  } else if (name == "sgd") {
    config = OptimizerConfig::Sgd(lr > 0 ? lr : 0.1);
    config.momentum = 0.9;
  } else if (name == "adagrad") {
    config = OptimizerConfig::Adagrad(lr > 0 ? lr : 0.05);
  } else if (name == "lion") {
    config = OptimizerConfig::Lion(lr > 0 ? lr : 3e-3);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown --optimizer '", name, "' (use adamw, adam, sgd, adagrad or lion)"));
  }
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  return config;
}

}  // namespace shardopt::train
