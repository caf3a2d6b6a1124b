// Test helpers for checkpoint files: a small model config, synthetic parts
// with known values, and in-place damage.
#ifndef SHARDOPT_COMMON_CHECKPOINT_TESTING_H_
#define SHARDOPT_COMMON_CHECKPOINT_TESTING_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/checkpoint_files.h"
#include "proto/shardopt/v1/checkpoint.pb.h"

namespace shardopt::checkpoint_testing {

// A fresh (removed) path under the test's temporary directory.
std::string TempDir(const std::string& name);
// Tensors of odd sizes, so that ranges of every shard count cut through them.
v1::ModelConfig Config(uint32_t shards, int64_t extra = 0);
// The value of section `section` at flat element `i` (exact in fp32).
float Value(int section, uint64_t i);
v1::CheckpointProgress Progress(int64_t step, const std::string& run_id = "run-a");
// Writes shard `shard`'s part (values Value()) into `dir`.
absl::StatusOr<CheckpointPartWritten> WritePart(const std::string& dir,
                                                const v1::ModelConfig& config, uint32_t shard,
                                                int64_t step = 7,
                                                const std::string& run_id = "run-a");
// A committed checkpoint of `shards` parts in TempDir(name).
std::string WriteCheckpoint(const std::string& name, uint32_t shards = 3, int64_t step = 7);
// Flips one byte of a file in place (a test failure when it cannot).
void FlipByte(const std::string& path, long offset);

}  // namespace shardopt::checkpoint_testing

#endif  // SHARDOPT_COMMON_CHECKPOINT_TESTING_H_
