// The consistency modes of a model's step protocol (ModelConfig.consistency
// in the proto), and the one rule on which settings go together: the client
// checks a spec with it before registering, the server checks every
// registration and checkpoint with the same function.
//
// - kSync: step k is applied once every trainer pushed it (the reduction of
//   their gradients); a shard's version is the step.
// - kAsync: each trainer's push of its step k is an optimizer step of its
//   own, applied as it arrives; a shard's version counts the pushes applied.
// - kBounded: kAsync, and trainer r's step k waits until every trainer has
//   pushed step k - staleness or later.
#ifndef SHARDOPT_COMMON_CONSISTENCY_H_
#define SHARDOPT_COMMON_CONSISTENCY_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardopt {

enum class Consistency { kSync, kAsync, kBounded };

// "sync", "async", "bounded".
const char* ConsistencyName(Consistency consistency);
// INVALID_ARGUMENT for any other name.
absl::StatusOr<Consistency> ConsistencyFromName(absl::string_view name);

inline bool IsAsynchronous(Consistency consistency) { return consistency != Consistency::kSync; }

// OK when the settings go together: kBounded with staleness >= 1, the other
// modes with 0. INVALID_ARGUMENT saying which setting is wrong otherwise.
absl::Status CheckConsistency(Consistency consistency, int64_t staleness);

// Whether the shards take decisions for a model's steps (clipping by the
// global norm, skips under loss scaling): synchronous models with gradient
// control. In the asynchronous modes each push is applied alone, so the
// trainer holding the whole gradient clips and skips it itself.
bool ShardsDecideSteps(Consistency consistency, double max_grad_norm, bool loss_scaling);

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_CONSISTENCY_H_
