// PushJournal: the last gradient a trainer pushed, kept in a local file so
// that the trainer, restarted after dying in the middle of that push, can
// send it again to the shards that missed it.
//
// Why: without a decision step, a shard applies step k as soon as it holds
// every trainer's push. A trainer that dies after pushing k to some shards
// leaves those shards at version k and the others at k - 1, waiting for it;
// its restarted process cannot recompute the gradient (version k - 1 no
// longer exists everywhere), but it can re-send the bytes it sent.
//
// The file is replaced atomically (temporary file, rename) before every
// push; it survives the process, not the machine (no fsync: a machine crash
// loses the shards' staging too).
#ifndef SHARDOPT_CLIENT_PUSH_JOURNAL_H_
#define SHARDOPT_CLIENT_PUSH_JOURNAL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"

namespace shardopt {

struct JournaledPush {
  std::string model_id;
  uint32_t trainer_rank = 0;
  int64_t step = 0;
  DType dtype = DType::kFloat32;
  double loss_scale = 1.0;
  std::vector<char> payload;  // The whole flat gradient as pushed (dtype).
};

// Replaces the journal at `path` with `push` (payload from `data`, `bytes`).
absl::Status WritePushJournal(const std::string& path, const JournaledPush& header,
                              const void* data, size_t bytes);
// NOT_FOUND when there is none; DATA_LOSS when it is damaged.
absl::StatusOr<JournaledPush> ReadPushJournal(const std::string& path);

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_PUSH_JOURNAL_H_
