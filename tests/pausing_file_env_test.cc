// The fault-injecting server's FileEnv: checkpoint data files stall once,
// after their first write and before they are committed; nothing else does.
#include "tests/support/pausing_file_env.h"

#include <string>

#include "absl/time/clock.h"
#include "common/file.h"
#include "gtest/gtest.h"
#include "tests/support/process.h"

namespace shardopt::testing {
namespace {

TEST(PausingFileEnvTest, RecognisesCheckpointDataFiles) {
  EXPECT_TRUE(IsCheckpointDataFile("/c/step-00000004/shard-00001-of-00003.bin"));
  EXPECT_TRUE(IsCheckpointDataFile("shard-00000-of-00001.bin"));
  EXPECT_FALSE(IsCheckpointDataFile("/c/step-00000004/shard-00001-of-00003.part.json"));
  EXPECT_FALSE(IsCheckpointDataFile("/c/step-00000004/manifest.json"));
  EXPECT_FALSE(IsCheckpointDataFile("/c/shard-1/port"));
}

TEST(PausingFileEnvTest, PausesDataFilesOnceAfterTheirFirstWrite) {
  constexpr absl::Duration kPause = absl::Milliseconds(300);
  PausingFileEnv env(FileEnv::Default(), kPause);
  const std::string dir = MakeTempDir("pausing_env");
  const std::string path = JoinPath(dir, "shard-00000-of-00002.bin");
  auto writer = env.NewAtomicFile(path);
  ASSERT_TRUE(writer.ok()) << writer.status();
  absl::Time start = absl::Now();
  ASSERT_TRUE((*writer)->Append("header").ok());
  EXPECT_GE(absl::Now() - start, kPause);
  // Meanwhile the file was there only under its temporary name.
  EXPECT_TRUE(FileExists(&env, (*writer)->temp_path()));
  EXPECT_FALSE(FileExists(&env, path));
  start = absl::Now();
  ASSERT_TRUE((*writer)->Append("data").ok());
  ASSERT_TRUE((*writer)->Commit().ok());
  EXPECT_LT(absl::Now() - start, kPause);
  EXPECT_EQ(ReadFileToString(&env, path).value(), "headerdata");

  // Other files pass straight through.
  start = absl::Now();
  ASSERT_TRUE(WriteFileAtomically(&env, JoinPath(dir, "manifest.json"), "{}").ok());
  EXPECT_LT(absl::Now() - start, kPause);
}

}  // namespace
}  // namespace shardopt::testing
