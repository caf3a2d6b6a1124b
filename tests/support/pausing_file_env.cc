#include "tests/support/pausing_file_env.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/time/clock.h"

namespace shardopt::testing {
namespace {

// The wrapped writer, sleeping once after its first successful Append.
class PausingWriter final : public AtomicFileWriter {
 public:
  PausingWriter(std::unique_ptr<AtomicFileWriter> target, absl::Duration pause)
      : target_(std::move(target)), pause_(pause) {}

  absl::Status Append(const void* data, size_t bytes) override {
    absl::Status s = target_->Append(data, bytes);
    if (s.ok() && !paused_) {
      paused_ = true;
      absl::SleepFor(pause_);
    }
    return s;
  }
  absl::Status Commit() override { return target_->Commit(); }
  uint64_t bytes_written() const override { return target_->bytes_written(); }
  const std::string& path() const override { return target_->path(); }
  const std::string& temp_path() const override { return target_->temp_path(); }

 private:
  const std::unique_ptr<AtomicFileWriter> target_;
  const absl::Duration pause_;
  bool paused_ = false;
};

}  // namespace

bool IsCheckpointDataFile(const std::string& path) {
  const std::string name = BaseName(path);
  return absl::StartsWith(name, "shard-") && absl::EndsWith(name, ".bin");
}

absl::StatusOr<std::unique_ptr<AtomicFileWriter>> PausingFileEnv::NewAtomicFile(
    const std::string& path) {
  absl::StatusOr<std::unique_ptr<AtomicFileWriter>> file = FileEnvWrapper::NewAtomicFile(path);
  if (!file.ok() || pause_ <= absl::ZeroDuration() || !IsCheckpointDataFile(path)) return file;
  return std::unique_ptr<AtomicFileWriter>(new PausingWriter(std::move(*file), pause_));
}

absl::StatusOr<std::unique_ptr<RandomAccessFile>> PausingFileEnv::NewRandomAccessFile(
    const std::string& path) {
  if (read_pause_ > absl::ZeroDuration() && IsCheckpointDataFile(path)) {
    absl::SleepFor(read_pause_);
  }
  return FileEnvWrapper::NewRandomAccessFile(path);
}

}  // namespace shardopt::testing
