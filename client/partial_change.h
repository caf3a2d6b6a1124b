// Whether a hyperparameter change (or cancel) that did not reach every shard
// is recorded in the trainer's history, from what each shard answered.
//
// Recorded when some shards took it and every other one was not reached
// (unreachable, timed out, its attempt cancelled): the trainer's pushes then
// carry the change to those, and recovery sends it to a restarted one,
// instead of the shards going on with different hyperparameters. Not when a
// shard refused it (a wrong kind, a full schedule): a push carrying it would
// be refused there too, and every later step with it.
#ifndef SHARDOPT_CLIENT_PARTIAL_CHANGE_H_
#define SHARDOPT_CLIENT_PARTIAL_CHANGE_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"

namespace shardopt {

// `answers`: each shard's, in shard order (UNKNOWN for a shard never asked).
// The shards that took the change when it is to be recorded; nullopt when
// not (none took it, or one refused it).
std::optional<std::vector<uint32_t>> ShardsThatTookARecordedChange(
    const std::vector<absl::Status>& answers);

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_PARTIAL_CHANGE_H_
