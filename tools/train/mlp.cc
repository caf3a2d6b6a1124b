#include "tools/train/mlp.h"

namespace shardopt::train {

absl::Status MlpConfig::Validate() const {
  if (input_dim <= 0 || num_classes < 2) {
    return absl::InvalidArgumentError(absl::StrCat("MLP needs input_dim > 0 and >= 2 classes; got ",
                                                   input_dim, " and ", num_classes));
  }
  for (int width : hidden) {
    if (width <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("hidden layer width ", width, " is not positive"));
    }
  }
  return absl::OkStatus();
}

std::vector<TensorSpec> MlpTensorSpecs(const MlpConfig& config) {
  std::vector<TensorSpec> specs;
  for (int l = 0; l < config.num_layers(); ++l) {
    const std::string prefix = absl::StrCat("fc", l + 1);
    specs.push_back({prefix + ".weight", {config.fan_in(l), config.fan_out(l)}, DType::kFloat32});
    specs.push_back({prefix + ".bias", {config.fan_out(l)}, DType::kFloat32});
  }
  return specs;
}

}  // namespace shardopt::train
