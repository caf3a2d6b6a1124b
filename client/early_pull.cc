#include "client/early_pull.h"

#include <utility>

namespace shardopt {

EarlyPull::EarlyPull(const std::vector<std::string>& addresses, ConnectionOptions connection) {
  connection.lane = 1;
  std::vector<ShardConnection*> raw;
  for (size_t i = 0; i < addresses.size(); ++i) {
    shards_.push_back(
        std::make_unique<ShardConnection>(static_cast<uint32_t>(i), addresses[i], connection));
    raw.push_back(shards_.back().get());
  }
  fanout_ = std::make_unique<ShardFanOut>(std::move(raw));
}

EarlyPull::~EarlyPull() {
  if (thread_) PushEnded(false).status().IgnoreError();
}

void EarlyPull::Prepare(const ModelLayout& layout, StepCallsContext calls,
                        const std::vector<std::shared_ptr<PayloadTransport>>& transports) {
  for (auto& shard : shards_) {
    const FlatRange range = layout.ShardRange(shard->index());
    if (shard->range().begin != range.begin || shard->range().end != range.end) {
      shard->set_range(range);
    }
    std::shared_ptr<PayloadTransport> transport =
        transports.empty() ? nullptr : transports[shard->index()];
    if (shard->transport() != transport.get()) shard->set_transport(std::move(transport));
  }
  calls.label = "pull overlapping the push: ";
  calls.canceller = &canceller_;
  calls.pushed_step_now = &pushed_step_;
  calls_ = std::make_shared<StepCalls>(fanout_.get(), std::move(calls));
}

void EarlyPull::Start(int64_t step, absl::Span<float> flat_params) {
  // (Not reset here: an Interrupt that came just before must end it.)
  pushed_step_ = step - 1;
  result_ = absl::UnknownError("no early pull");
  thread_.emplace([this, step, flat_params, calls = calls_] {
    result_ = calls->Pull(step, 0, nullptr, flat_params.data());
  });
}

absl::StatusOr<PulledVersion> EarlyPull::PushEnded(bool push_ok) {
  if (!thread_) return absl::FailedPreconditionError("no early pull is running");
  pushed_step_ = pushed_step_ + 1;
  if (!push_ok) canceller_.Cancel();
  thread_->join();
  thread_.reset();
  canceller_.Reset();
  return result_;
}

int64_t EarlyPull::failed_attempts(size_t shard) const {
  return shard < shards_.size() ? shards_[shard]->unreachable_attempts() : 0;
}

}  // namespace shardopt
