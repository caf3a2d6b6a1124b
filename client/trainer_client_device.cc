// TrainerClient::StepOnDevice (see trainer_client.h): Step through host
// mirrors of a GPU trainer's buffers, with their device twins registered
// for the device-pair transports (client/device_twins.h).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "client/trainer_client.h"

namespace shardopt {

absl::StatusOr<StepResult> TrainerClient::StepOnDevice(int64_t step, const float* device_grads,
                                                       float* device_params) {
  if (pair_kind_ == nullptr) {
    return absl::FailedPreconditionError(
        "StepOnDevice needs device pairs (TrainerClientOptions::device_pairs)");
  }
  if (!layout_) return absl::FailedPreconditionError("call Register or Attach first");
  const size_t count = layout_->total_elements();
  const int gpu = options_.device_pair_gpu;
  device_step_grads_.resize(count);
  device_step_params_.resize(count);
  if (absl::Status s = pair_kind_->CopyToHost(gpu, device_step_grads_.data(), device_grads,
                                              count * sizeof(float));
      !s.ok()) {
    return s;
  }
  twins_->Set(device_step_grads_.data(), device_grads, device_step_params_.data(), device_params,
              count);
  absl::StatusOr<StepResult> result =
      Step(step, device_step_grads_, absl::MakeSpan(device_step_params_));
  std::vector<FlatRange> on_device = twins_->Clear();
  if (!result.ok()) return result;
  // The parts no pair wrote went to the host mirror: to the device now.
  std::sort(on_device.begin(), on_device.end(),
            [](const FlatRange& a, const FlatRange& b) { return a.begin < b.begin; });
  uint64_t next = 0;
  const auto copy = [&](uint64_t begin, uint64_t end) -> absl::Status {
    if (end <= begin) return absl::OkStatus();
    return pair_kind_->CopyFromHost(gpu, device_params + begin, device_step_params_.data() + begin,
                                    (end - begin) * sizeof(float));
  };
  for (const FlatRange& written : on_device) {
    if (absl::Status s = copy(next, written.begin); !s.ok()) return s;
    next = std::max(next, written.end);
  }
  if (absl::Status s = copy(next, count); !s.ok()) return s;
  return result;
}

}  // namespace shardopt
