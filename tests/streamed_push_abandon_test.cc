// "Any other call first abandons an open streamed push": a streamed push
// whose gradient is half ready holds the shards' workers (its chunks wait
// for MarkGradientReady). Every other call of the client must end it first
// and then run as usual; PullToResume used to call the shards first and
// waited forever (nothing, not even Interrupt, ended it).
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "client/trainer_client.h"
#include "gtest/gtest.h"
#include "tests/support/process.h"
#include "tests/support/two_shard_cluster.h"

namespace shardopt::testing {
namespace {

constexpr uint64_t kElements = 8192;

class StreamedPushAbandonTest : public TwoShardClusterTest {
 protected:
  // A fresh model `model_id` with a streamed push of step 1 open and only
  // its first half ready, then `call` on the same client; the call must end
  // within 60 s (else the test process exits: it would hang for good).
  void RunWithStreamedPushOpen(const std::string& model_id,
                               const std::function<absl::Status(TrainerClient&)>& call) {
    std::unique_ptr<TrainerClient> trainer = Connect(0);
    ModelSpec spec;
    spec.model_id = model_id;
    spec.tensors = {TensorSpec{"w", {kElements}, DType::kFloat32}};
    spec.optimizer = OptimizerConfig::Sgd(0.5);
    spec.num_trainers = 1;
    std::vector<float> params(kElements, 0.25f);
    ASSERT_TRUE(trainer->Register(spec, params).ok());
    const std::vector<float> grad(kElements, 0.125f);
    ASSERT_TRUE(trainer->BeginStreamedPush(1, grad).ok());
    trainer->MarkGradientReady(0, kElements / 2);

    absl::Notification ended;
    absl::Status status;
    std::thread caller([&] {
      status = call(*trainer);
      ended.Notify();
    });
    if (!ended.WaitForNotificationWithTimeout(absl::Seconds(60))) {
      std::cerr << model_id << ": the call did not end with a streamed push open\n";
      std::_Exit(1);
    }
    caller.join();
    EXPECT_TRUE(status.ok()) << model_id << ": " << status;
    // Nothing of the abandoned push was used; the step then runs as usual.
    std::vector<float> pulled(kElements);
    EXPECT_EQ(trainer->Pull(0, absl::MakeSpan(pulled)).value(), 0) << model_id;
    EXPECT_EQ(pulled, params) << model_id;
    ASSERT_TRUE(trainer->Step(1, grad, absl::MakeSpan(params)).ok()) << model_id;
    EXPECT_EQ(params, std::vector<float>(kElements, 0.25f - 0.0625f)) << model_id;
  }
};

TEST_F(StreamedPushAbandonTest, PullToResume) {
  RunWithStreamedPushOpen("resume", [](TrainerClient& t) -> absl::Status {
    std::vector<float> params(kElements);
    absl::StatusOr<int64_t> version = t.PullToResume(absl::MakeSpan(params));
    if (version.ok() && *version != 0) return absl::InternalError("resumed past version 0");
    return version.status();
  });
}

TEST_F(StreamedPushAbandonTest, PullInspectCheckpointAndWait) {
  RunWithStreamedPushOpen("pull", [](TrainerClient& t) {
    std::vector<float> params(kElements);
    return t.Pull(0, absl::MakeSpan(params)).status();
  });
  RunWithStreamedPushOpen("inspect", [](TrainerClient& t) { return t.InspectJson().status(); });
  const std::string directory = MakeTempDir("abandon_checkpoint");
  RunWithStreamedPushOpen(
      "checkpoint", [&](TrainerClient& t) { return t.Checkpoint(directory + "/step-0").status(); });
  RunWithStreamedPushOpen("wait", [](TrainerClient& t) { return t.WaitForEveryTrainer(0); });
}

}  // namespace
}  // namespace shardopt::testing
