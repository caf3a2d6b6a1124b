// Pieces of ShardServiceImpl's replies that several of its calls fill the
// same way.
#ifndef SHARDOPT_SERVER_SERVICE_REPLIES_H_
#define SHARDOPT_SERVER_SERVICE_REPLIES_H_

#include <grpcpp/server_context.h>
#include <grpcpp/support/status.h>

#include <algorithm>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/grpc_status.h"
#include "common/layout.h"
#include "proto/shardopt/v1/shard_service.pb.h"
#include "server/model_shard.h"

namespace shardopt {

inline grpc::Status Error(const absl::Status& status) { return ToGrpcStatus(status); }

// A transfer whose data plane failed (a payload socket's link, a device
// pair; `what`: "the push's payload", "the pull's link"): UNAVAILABLE
// whatever the plane said (a timeout included, which must not read as a
// wait's "still waiting" report), so that the trainer retries over a new
// link or pair or another plane; CANCELLED when the trainer gave up (an
// abandoned push).
inline absl::Status DataPlaneFailed(const char* what, const absl::Status& s) {
  return absl::Status(absl::IsCancelled(s) ? s.code() : absl::StatusCode::kUnavailable,
                      absl::StrCat(what, ": ", s.message()));
}

// A wait of a call that asked for at most `max_wait_ms` (0: the call's
// deadline) ends then, answering what it still waits for.
inline absl::Time WaitDeadline(const grpc::ServerContext& context, int64_t max_wait_ms) {
  const absl::Time deadline = absl::FromChrono(context.deadline());
  if (max_wait_ms <= 0) return deadline;
  return std::min(deadline, absl::Now() + absl::Milliseconds(max_wait_ms));
}

// The push a waiting trainer made (its request's trainer_rank, pushed_step).
template <typename Request>
std::optional<ModelShard::PushedBy> PushedByOf(const Request& request) {
  if (request.pushed_step() <= 0) return std::nullopt;
  return ModelShard::PushedBy{request.trainer_rank(), request.pushed_step()};
}

inline void SetRange(const FlatRange& range, v1::ShardRange* proto) {
  proto->set_begin(range.begin);
  proto->set_end(range.end);
}

inline void FillByteCounts(const ShardSnapshot& snap, v1::ByteCounts* bytes) {
  bytes->set_parameter_bytes(snap.parameter_bytes);
  bytes->set_optimizer_state_bytes(snap.optimizer_state_bytes);
  bytes->set_staging_bytes(snap.staging_bytes);
  bytes->set_gradient_bytes_received(snap.gradient_bytes_received);
  bytes->set_parameter_bytes_sent(snap.parameter_bytes_sent);
}

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_SERVICE_REPLIES_H_
