#include "server/model_registry.h"

#include "absl/strings/str_cat.h"
#include "common/names.h"

namespace shardopt {

absl::StatusOr<std::shared_ptr<HostedModel>> ModelRegistry::Find(
    const std::string& model_id) const {
  // An id no model can have is a malformed request, and is not echoed whole.
  if (absl::Status s = CheckId("model_id", model_id); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto it = models_.find(model_id);
  if (it == models_.end()) {
    return absl::NotFoundError(
        absl::StrCat("model '", model_id, "' is not registered on shard ", shard_index_));
  }
  return it->second;
}

std::vector<std::shared_ptr<HostedModel>> ModelRegistry::All() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<HostedModel>> all;
  for (const auto& [id, model] : models_) all.push_back(model);
  return all;
}

std::shared_ptr<HostedModel> ModelRegistry::Install(std::shared_ptr<HostedModel> model) {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return nullptr;
    auto [it, inserted] = models_.emplace(model->config().model_id(), model);
    if (!inserted) return it->second;
  }
  model->StartCheckpoints();
  return model;
}

absl::Status ModelRegistry::Replace(const std::shared_ptr<HostedModel>& old_model,
                                    std::shared_ptr<HostedModel> new_model) {
  // Before anyone sees it (a /metrics scrape): its counters go on from the
  // old one's. (Read from the old one's shard, which still runs.)
  new_model->TakeOverAppliedSteps(*old_model);
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return absl::UnavailableError("the shard server is shutting down");
    auto it = models_.find(old_model->config().model_id());
    if (it == models_.end() || it->second != old_model) {
      return absl::AbortedError(absl::StrCat("model '", old_model->config().model_id(),
                                             "' was replaced meanwhile on shard ", shard_index_));
    }
    it->second = new_model;
  }
  // Outside the lock: waits for the old model's checkpoint write, if any.
  old_model->Stop();
  new_model->StartCheckpoints();
  return absl::OkStatus();
}

void ModelRegistry::StopAll() {
  std::vector<std::shared_ptr<HostedModel>> all;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    for (const auto& [id, model] : models_) all.push_back(model);
  }
  for (auto& model : all) model->Stop();
}

}  // namespace shardopt
