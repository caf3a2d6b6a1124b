// SIGTERM / SIGINT of a real server process (server/shutdown_signals.h):
// during a restore (stalled here by the fault-injecting server) a signal
// ends the process at once without serving; during a shutdown stuck on a
// checkpoint write, a second signal ends it at once; both exit 1 by the
// server's own hand (before, whichever thread did not block the signal took
// it: OpenBLAS's pool, where the default action killed the process without
// a word, by accident).
#include <signal.h>
#include <sys/stat.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/trainer_client.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"

namespace shardopt::testing {
namespace {

constexpr int64_t kElements = 4096;

ModelSpec Spec() {
  ModelSpec spec;
  spec.model_id = "signals";
  spec.tensors = {TensorSpec{"w", {kElements}, DType::kFloat32}};
  spec.optimizer = OptimizerConfig::Sgd(0.5);
  spec.num_trainers = 1;
  return spec;
}

// Registers the model on the server at `address` and takes step 1.
void TakeOneStep(const std::string& address) {
  std::unique_ptr<TrainerClient> trainer =
      TrainerClient::Connect({address}, TrainerClientOptions()).value();
  std::vector<float> params(kElements, 0.25f);
  ASSERT_TRUE(trainer->Register(Spec(), params).ok());
  ASSERT_TRUE(trainer->Step(1, std::vector<float>(kElements, 0.125f), absl::MakeSpan(params)).ok());
}

TEST(ShutdownSignalsTest, ASignalDuringTheRestoreEndsTheProcessWithoutServing) {
  const std::string root = MakeTempDir("signal_restore");
  const std::string ckpt = root + "/ckpt";
  const std::vector<std::string> flags = {"--checkpoint_dir=" + ckpt, "--checkpoint_every=1",
                                          "--restore_from=" + ckpt};
  {
    auto server = ServerProcess::Start(0, 1, flags);
    ASSERT_TRUE(server.ok()) << server.status();
    ASSERT_NO_FATAL_FAILURE(TakeOneStep((*server)->address()));
    auto stub = NewStub((*server)->address());
    v1::InspectResponse inspect;
    for (int i = 0; i < 500 && inspect.newest_committed_checkpoint() < 1; ++i) {
      ASSERT_TRUE(RawInspect(*stub, "signals", &inspect).ok());
      absl::SleepFor(absl::Milliseconds(10));
    }
    ASSERT_EQ(inspect.newest_committed_checkpoint(), 1);
  }
  const std::string port_file = root + "/port";
  std::vector<std::string> args = flags;
  args.push_back("--listen=127.0.0.1:0");
  args.push_back("--port_file=" + port_file);
  args.push_back("--pause_checkpoint_data_reads_ms=60000");
  auto proc = ChildProcess::Start(Runfile("tests/fault_injecting_server"), args);
  ASSERT_TRUE(proc.ok()) << proc.status();
  absl::SleepFor(absl::Seconds(1));  // Into the stalled restore.
  (*proc)->Signal(SIGTERM);
  const std::optional<int> rc = (*proc)->Wait(absl::Seconds(10));
  if (!rc.has_value()) (*proc)->Signal(SIGKILL);
  ASSERT_TRUE(rc.has_value()) << "SIGTERM waited for the restore";
  // Its own exit, not the signal's default action (which ended it where a
  // thread that does not block the signal took it: OpenBLAS's pool).
  EXPECT_EQ(*rc, 1);
  struct stat info;
  EXPECT_NE(stat(port_file.c_str(), &info), 0) << "it served";
}

TEST(ShutdownSignalsTest, ASecondSignalEndsAShutdownThatWaits) {
  const std::string root = MakeTempDir("signal_twice");
  ServerPlacement faulty;
  faulty.binary = "tests/fault_injecting_server";
  // Each checkpoint data file stalls for a minute after its header: the
  // shutdown waits for the periodic checkpoint of step 0.
  auto server = ServerProcess::Start(
      0, 1,
      {"--checkpoint_dir=" + root + "/ckpt", "--checkpoint_every=1",
       "--pause_checkpoint_data_writes_ms=60000"},
      faulty);
  ASSERT_TRUE(server.ok()) << server.status();
  // The registration starts the periodic checkpoint of step 0.
  std::unique_ptr<TrainerClient> trainer =
      TrainerClient::Connect({(*server)->address()}, TrainerClientOptions()).value();
  ASSERT_TRUE(trainer->Register(Spec(), std::vector<float>(kElements, 0.25f)).ok());
  absl::SleepFor(absl::Milliseconds(500));  // Into the stalled write.
  ChildProcess& process = (*server)->process();
  process.Signal(SIGTERM);
  EXPECT_FALSE(process.Wait(absl::Milliseconds(1500)).has_value()) << "the shutdown did not wait";
  process.Signal(SIGTERM);  // (More than 1 s later: not the first sent twice.)
  const std::optional<int> rc = process.Wait(absl::Seconds(10));
  if (!rc.has_value()) process.Signal(SIGKILL);
  ASSERT_TRUE(rc.has_value()) << "the second SIGTERM was ignored";
  EXPECT_EQ(*rc, 1);
}

// One request sent twice (a terminal's Ctrl-C and a script's SIGTERM to the
// process group; GNU timeout's two kills) is still the graceful shutdown.
TEST(ShutdownSignalsTest, TwoSignalsCloseTogetherAreOneShutdown) {
  auto server = ServerProcess::Start(0, 1);
  ASSERT_TRUE(server.ok()) << server.status();
  ChildProcess& process = (*server)->process();
  process.Signal(SIGINT);
  absl::SleepFor(absl::Milliseconds(100));
  process.Signal(SIGTERM);
  const std::optional<int> rc = process.Wait(absl::Seconds(10));
  ASSERT_TRUE(rc.has_value());
  EXPECT_EQ(*rc, 0);
}

}  // namespace
}  // namespace shardopt::testing
