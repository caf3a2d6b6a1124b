// ModelRegistry: the models one shard server holds, by id. Installing a new
// model, finding one for a call, replacing one wholesale (a rollback) and
// stopping them all at shutdown. Calls hold a shared_ptr for as long as they
// use a model, so a replaced or stopped model lives until its last call
// ends (and then gives back its state budget). Thread-safe.
#ifndef SHARDOPT_SERVER_MODEL_REGISTRY_H_
#define SHARDOPT_SERVER_MODEL_REGISTRY_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/hosted_model.h"

namespace shardopt {

class ModelRegistry {
 public:
  explicit ModelRegistry(uint32_t shard_index) : shard_index_(shard_index) {}
  ~ModelRegistry() { StopAll(); }

  // NOT_FOUND naming the model and this shard.
  absl::StatusOr<std::shared_ptr<HostedModel>> Find(const std::string& model_id) const;
  std::vector<std::shared_ptr<HostedModel>> All() const;

  // Adds `model` and starts its periodic checkpoints. Returns `model`, or
  // the model already there under its id (the caller lost a race), or
  // nullptr after StopAll().
  std::shared_ptr<HostedModel> Install(std::shared_ptr<HostedModel> model);
  // Replaces `old_model` by `new_model` (same id), stopping the old one and
  // starting the new one's checkpoints. ABORTED when `old_model` is no
  // longer the one installed (replaced meanwhile); UNAVAILABLE after
  // StopAll().
  absl::Status Replace(const std::shared_ptr<HostedModel>& old_model,
                       std::shared_ptr<HostedModel> new_model);

  // Stops every model (waiters get UNAVAILABLE); later installs fail.
  void StopAll();

 private:
  const uint32_t shard_index_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<HostedModel>> models_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_MODEL_REGISTRY_H_
