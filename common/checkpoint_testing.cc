#include "common/checkpoint_testing.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/proto_convert.h"
#include "gtest/gtest.h"

namespace shardopt::checkpoint_testing {

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(base ? base : "/tmp", "/", name, "_", ::getpid());
  std::system(absl::StrCat("rm -rf ", dir).c_str());
  return dir;
}

v1::ModelConfig Config(uint32_t shards, int64_t extra) {
  const ModelLayout layout =
      ModelLayout::Create({{"w", {37, 11}}, {"b", {11}}, {"e", {5, 3 + extra}}}, 16, shards)
          .value();
  v1::ModelConfig config;
  config.set_model_id("m");
  *config.mutable_layout() = LayoutToProto(layout);
  OptimizerConfig adamw = OptimizerConfig::AdamW(1e-3);
  adamw.amsgrad = true;
  *config.mutable_optimizer() = OptimizerConfigToProto(adamw);
  config.set_num_trainers(2);
  config.set_shard_count(shards);
  return config;
}

float Value(int section, uint64_t i) { return static_cast<float>(section * 10000) + 0.5f * i; }

v1::CheckpointProgress Progress(int64_t step, const std::string& run_id) {
  v1::CheckpointProgress progress;
  progress.set_run_id(run_id);
  progress.set_version(step);
  progress.set_optimizer_steps(step);
  progress.set_last_lr(1e-3);
  return progress;
}

absl::StatusOr<CheckpointPartWritten> WritePart(const std::string& dir,
                                                const v1::ModelConfig& config, uint32_t shard,
                                                int64_t step, const std::string& run_id) {
  const ModelLayout layout = LayoutFromProto(config.layout(), config.shard_count()).value();
  const FlatRange range = layout.ShardRange(shard);
  return WriteCheckpointPart(dir, config, shard, Progress(step, run_id),
                             [&](int section, uint64_t offset, uint64_t count, float* out) {
                               for (uint64_t k = 0; k < count; ++k) {
                                 out[k] = Value(section, range.begin + offset + k);
                               }
                               return absl::OkStatus();
                             });
}

std::string WriteCheckpoint(const std::string& name, uint32_t shards, int64_t step) {
  const std::string dir = TempDir(name);
  const v1::ModelConfig config = Config(shards);
  for (uint32_t i = 0; i < shards; ++i) {
    absl::StatusOr<CheckpointPartWritten> w = WritePart(dir, config, i, step);
    EXPECT_TRUE(w.ok()) << w.status();
  }
  return dir;
}

void FlipByte(const std::string& path, long offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(offset);
  char c = 0;
  f.read(&c, 1);
  c ^= 0x40;
  f.seekp(offset);
  f.write(&c, 1);
  EXPECT_TRUE(f.good()) << "flipping byte " << offset << " of " << path;
}

}  // namespace shardopt::checkpoint_testing
