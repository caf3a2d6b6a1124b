// PausingFileEnv: a FileEnv for fault-injection tests that stalls every
// checkpoint data file ("shard-*.bin", common/checkpoint_files.h) once, right
// after its first write (the header), so that a test can kill a server while
// the file is half-written under its temporary name; and, with a read
// pause, every opening of one for reading (a restore that takes long).
// Every other file and operation passes straight through to the wrapped
// FileEnv.
#ifndef SHARDOPT_TESTS_SUPPORT_PAUSING_FILE_ENV_H_
#define SHARDOPT_TESTS_SUPPORT_PAUSING_FILE_ENV_H_

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "common/file.h"

namespace shardopt::testing {

// Whether `path` names a checkpoint data file: "shard-*.bin".
bool IsCheckpointDataFile(const std::string& path);

// Thread-safe (as its target); `target` must outlive it and the writers it
// returns.
class PausingFileEnv : public FileEnvWrapper {
 public:
  PausingFileEnv(FileEnv* target, absl::Duration pause,
                 absl::Duration read_pause = absl::ZeroDuration())
      : FileEnvWrapper(target), pause_(pause), read_pause_(read_pause) {}

  absl::StatusOr<std::unique_ptr<AtomicFileWriter>> NewAtomicFile(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) override;

 private:
  const absl::Duration pause_;
  const absl::Duration read_pause_;
};

}  // namespace shardopt::testing

#endif  // SHARDOPT_TESTS_SUPPORT_PAUSING_FILE_ENV_H_
