// fault_injecting_server: shardopt_server (the same program, server/
// server_main.h) plus flags for fault-injection tests. Never deployed: it
// lives under tests/ and is testonly.
//
//   --pause_checkpoint_data_writes_ms=N  stall every checkpoint data file
//       (shard-*.bin) N ms after its first write, while it exists only under
//       its temporary name, so that a test can kill the server mid-checkpoint
//       (tests/durability_test.cc). 0: no pause.
//   --pause_checkpoint_data_reads_ms=N  stall every opening of a checkpoint
//       data file for reading N ms (a restore that takes long). 0: no pause.
//   --fail_first_set_aside  the first rename of a step directory aside as
//       abandoned (a rollback's) fails (tests/rollback_journal_test.cc).
//   --unlistable_directory=NAME  every directory named NAME cannot be
//       listed (PERMISSION_DENIED), as a root-owned lost+found for a server
//       that is not root (tests/server_lifecycle_test.cc).
#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "absl/time/time.h"
#include "common/file.h"
#include "server/server_main.h"
#include "tests/support/failing_set_aside_env.h"
#include "tests/support/pausing_file_env.h"
#include "tests/support/unlistable_directory_env.h"

ABSL_FLAG(int64_t, pause_checkpoint_data_writes_ms, 0,
          "Stall each checkpoint data file (shard-*.bin) this long after its first write.");
ABSL_FLAG(int64_t, pause_checkpoint_data_reads_ms, 0,
          "Stall each opening of a checkpoint data file for reading this long.");
ABSL_FLAG(bool, fail_first_set_aside, false,
          "Fail the first rename of a checkpoint step directory aside as abandoned.");
ABSL_FLAG(std::string, unlistable_directory, "",
          "Directories of this name cannot be listed (PERMISSION_DENIED).");

int main(int argc, char** argv) {
  // The env is never freed: the server uses it until the process ends.
  return shardopt::RunShardServer(argc, argv, []() -> shardopt::FileEnv* {
    shardopt::FileEnv* env = new shardopt::testing::PausingFileEnv(
        shardopt::FileEnv::Default(),
        absl::Milliseconds(absl::GetFlag(FLAGS_pause_checkpoint_data_writes_ms)),
        absl::Milliseconds(absl::GetFlag(FLAGS_pause_checkpoint_data_reads_ms)));
    if (absl::GetFlag(FLAGS_fail_first_set_aside)) {
      env = new shardopt::testing::FailingSetAsideEnv(env);
    }
    if (!absl::GetFlag(FLAGS_unlistable_directory).empty()) {
      env = new shardopt::testing::UnlistableDirectoryEnv(
          env, absl::GetFlag(FLAGS_unlistable_directory));
    }
    return env;
  });
}
