#include "server/optim/optimizer.h"

#include <utility>

#include "absl/status/status.h"
#include "server/optim/optimizer_internal.h"

namespace shardopt {

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const OptimizerConfig& config,
                                                             size_t size) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  switch (config.kind) {
    case OptimizerKind::kSgd:
      return optim_internal::NewSgd(config, size);
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      return optim_internal::NewAdam(config, size);
    case OptimizerKind::kAdagrad:
      return optim_internal::NewAdagrad(config, size);
    case OptimizerKind::kLion:
      return optim_internal::NewLion(config, size);
  }
  return absl::InvalidArgumentError("unknown optimizer kind");
}

absl::Status Optimizer::SetConfig(const OptimizerConfig& config) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  if (absl::Status s = config_.CheckCanChangeTo(config); !s.ok()) return s;
  config_ = config;
  return absl::OkStatus();
}

float* Optimizer::AddSlot(const std::string& name, float initial_value) {
  slot_names_.push_back(name);
  slots_.emplace_back(size_, initial_value);
  return slots_.back().data();
}

size_t Optimizer::state_bytes() const {
  size_t bytes = 0;
  for (const std::vector<float>& s : slots_) bytes += s.size() * sizeof(float);
  return bytes;
}

}  // namespace shardopt
