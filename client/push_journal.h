// One journaled push: a file holding one step's gradient exactly as a
// trainer pushed it (model, rank, step, wire dtype, loss scale, payload).
// PushHistory keeps one such file per step in a trainer's journal directory,
// so that a restarted trainer can re-send what shards lack, including a push
// it died in the middle of.
//
// Written atomically through the file layer (common/file.h: temporary file,
// fsync, rename, fsync of the directory) before the push goes out.
#ifndef SHARDOPT_CLIENT_PUSH_JOURNAL_H_
#define SHARDOPT_CLIENT_PUSH_JOURNAL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "common/file.h"

namespace shardopt {

struct JournaledPush {
  std::string model_id;
  uint32_t trainer_rank = 0;
  int64_t step = 0;
  DType dtype = DType::kFloat32;
  double loss_scale = 1.0;
  std::vector<char> payload;  // The whole flat gradient as pushed (dtype).
};

// Replaces the file at `path` with `push` (payload from `data`, `bytes`).
absl::Status WritePushJournal(const std::string& path, const JournaledPush& header,
                              const void* data, size_t bytes,
                              FileEnv* env = FileEnv::Default());
// NOT_FOUND when there is none; DATA_LOSS when it is damaged.
absl::StatusOr<JournaledPush> ReadPushJournal(const std::string& path,
                                              FileEnv* env = FileEnv::Default());
// The same without the payload (left empty, not read): whose push it is.
absl::StatusOr<JournaledPush> ReadPushJournalHeader(const std::string& path,
                                                    FileEnv* env = FileEnv::Default());

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_PUSH_JOURNAL_H_
