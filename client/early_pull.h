// EarlyPull: the pull of a step opened before its push has ended (steps
// without gradient control, TrainerClientOptions::overlap_pull), on a second
// connection per shard (lane 1: separate TCP connections), so that the
// shards' ranges stream into the parameter buffer as they are updated.
//
// Start() runs the pull on a thread of its own; PushEnded() says how the
// push went (a failed push cancels the pull) and joins it. While the push
// streams, its attempts say this trainer pushed the step before (a shard that
// lost that answers OUT_OF_RANGE at once); once the push is in, the step
// itself (a shard restarted since answers OUT_OF_RANGE at its next attempt).
// Whatever goes wrong with it, the caller pulls again the usual way. One
// pull at a time, from the trainer's thread.
#ifndef SHARDOPT_CLIENT_EARLY_PULL_H_
#define SHARDOPT_CLIENT_EARLY_PULL_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/shard_connection.h"
#include "client/shard_fanout.h"
#include "client/step_calls.h"
#include "common/layout.h"

namespace shardopt {

class EarlyPull {
 public:
  // Connections of lane 1 to `addresses` (shard order).
  EarlyPull(const std::vector<std::string>& addresses, ConnectionOptions connection);
  ~EarlyPull();

  // After Register/Attach: the layout and how calls are made. Safe while a
  // pull runs (a re-attach inside a push): the ranges are written only when
  // they change, and the running pull keeps the calls it started with.
  // `transports` (shard order, empty: none) are the pairs' other data
  // planes, shared with lane 0.
  void Prepare(const ModelLayout& layout, StepCallsContext calls,
               const std::vector<std::shared_ptr<PayloadTransport>>& transports);
  bool prepared() const { return calls_ != nullptr; }

  // Opens the pull of version `step` into `flat_params`, which must stay
  // valid until PushEnded() returns.
  void Start(int64_t step, absl::Span<float> flat_params);
  bool running() const { return thread_.has_value(); }
  // Joins the pull (cancelled first unless `push_ok`); its result.
  absl::StatusOr<PulledVersion> PushEnded(bool push_ok);
  // From another thread: the pull running (or the next one) ends CANCELLED,
  // until PushEnded or ClearInterrupt. See TrainerClient::Interrupt.
  void Interrupt() { canceller_.Cancel(); }
  void ClearInterrupt() { canceller_.Reset(); }

  int64_t failed_attempts(size_t shard) const;

 private:
  std::vector<std::unique_ptr<ShardConnection>> shards_;
  std::unique_ptr<ShardFanOut> fanout_;
  RunCanceller canceller_;
  std::atomic<int64_t> pushed_step_{0};
  std::shared_ptr<StepCalls> calls_;
  std::optional<std::thread> thread_;
  absl::StatusOr<PulledVersion> result_ = absl::UnknownError("no early pull");
};

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_EARLY_PULL_H_
