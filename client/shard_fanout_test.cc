// ShardFanOut's reports of a call that keeps failing: routine short
// failures stay out of the log; one failing for kRetryReportAfter (5 s) or
// an attempt that ran out its deadline is logged, naming the shard, its
// address, the call and the status. The attempts are functions here (no
// server): only the fan-out's retry loop is under test.
#include "client/shard_fanout.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/loopback_listener_testing.h"
#include "gtest/gtest.h"

namespace shardopt {
namespace {

constexpr char kAddress[] = "127.0.0.1:1";  // Never dialled: the attempts are functions.

// The log lines of retries in `captured`.
std::vector<std::string> RetryLines(const std::string& captured) {
  std::vector<std::string> lines;
  for (absl::string_view line : absl::StrSplit(captured, '\n')) {
    if (absl::StrContains(line, "retrying for up to")) lines.emplace_back(line);
  }
  return lines;
}

// Runs a call whose attempts fail with `failure` until `fail_for` has
// passed since the first one, then succeed; returns the retry log lines.
std::vector<std::string> RunFailingFor(absl::Duration fail_for, const absl::Status& failure,
                                       absl::Duration attempt_timeout, absl::Status* result) {
  ShardConnection connection(0, kAddress, ConnectionOptions{});
  ShardFanOut fanout({&connection});
  ShardFanOut::Call call;
  call.what = "PushGradients step 7";
  call.policy.budget = absl::Seconds(30);
  call.policy.max_backoff = absl::Milliseconds(200);
  call.attempt_timeout = attempt_timeout;
  const absl::Time start = absl::Now();
  testing::internal::CaptureStderr();
  *result = fanout.Run(call, [&](ShardConnection&, grpc::ClientContext&) -> absl::Status {
    if (absl::Now() - start >= fail_for) return absl::OkStatus();
    if (absl::IsDeadlineExceeded(failure)) absl::SleepFor(attempt_timeout);  // Runs it out.
    return failure;
  });
  return RetryLines(testing::internal::GetCapturedStderr());
}

TEST(ShardFanOutRetryReportTest, ShortFailuresAreNotLogged) {
  absl::Status result;
  const std::vector<std::string> lines = RunFailingFor(
      absl::Seconds(1), absl::UnavailableError("connection refused"), absl::Seconds(60), &result);
  EXPECT_TRUE(result.ok()) << result;
  EXPECT_TRUE(lines.empty()) << lines.front();
}

TEST(ShardFanOutRetryReportTest, AFailureLastingFiveSecondsIsLoggedOnce) {
  absl::Status result;
  const std::vector<std::string> lines =
      RunFailingFor(absl::Milliseconds(5600), absl::UnavailableError("connection refused"),
                    absl::Seconds(60), &result);
  EXPECT_TRUE(result.ok()) << result;
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(absl::StrContains(
      lines[0], absl::StrCat("shard 0 (", kAddress, "): PushGradients step 7: attempt failed")))
      << lines[0];
  EXPECT_TRUE(absl::StrContains(lines[0], "UNAVAILABLE: connection refused")) << lines[0];
}

TEST(ShardFanOutRetryReportTest, AnAttemptThatRanOutItsDeadlineIsLoggedAtOnce) {
  absl::Status result;
  const std::vector<std::string> lines =
      RunFailingFor(absl::Milliseconds(200), absl::DeadlineExceededError("Deadline Exceeded"),
                    absl::Milliseconds(300), &result);
  EXPECT_TRUE(result.ok()) << result;
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_TRUE(absl::StrContains(lines[0], "attempt failed after 0.3 s (DEADLINE_EXCEEDED"))
      << lines[0];
}

// A second Run() while one is in flight (calls of one client overlapped,
// e.g. a streamed push's thread and the trainer's) is refused at once: it
// would take the workers the first one's attempts wait on, and both would
// wait forever.
TEST(ShardFanOutTest, AnOverlappingRunIsRefusedNotQueued) {
  ShardConnection connection(0, kAddress, ConnectionOptions{});
  ShardFanOut fanout({&connection});
  ShardFanOut::Call call;
  call.what = "PushGradients step 3";
  call.attempt_timeout = absl::Seconds(30);
  absl::Notification started, release;
  absl::Status first;
  std::thread runner([&] {
    first = fanout.Run(call, [&](ShardConnection&, grpc::ClientContext&) -> absl::Status {
      started.Notify();
      release.WaitForNotificationWithTimeout(absl::Seconds(30));
      return absl::OkStatus();
    });
  });
  ASSERT_TRUE(started.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ShardFanOut::Call second = call;
  second.what = "PullParameters version >= 2";
  const absl::Status refused =
      fanout.Run(second, [](ShardConnection&, grpc::ClientContext&) { return absl::OkStatus(); });
  EXPECT_EQ(refused.code(), absl::StatusCode::kInternal) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "PullParameters version >= 2")) << refused;
  release.Notify();
  runner.join();
  EXPECT_TRUE(first.ok()) << first;
  // Once it ended, the next one runs.
  EXPECT_TRUE(
      fanout.Run(second, [](ShardConnection&, grpc::ClientContext&) { return absl::OkStatus(); })
          .ok());
}

// A call an attempt makes on a FollowUpContext (one attempt that sends
// several requests) ends when the run is cancelled (Ctrl-C), as the
// attempt's own call does, not at its own deadline. The shard here accepts
// TCP connections and never answers.
TEST(ShardFanOutTest, AFollowUpCallIsCancelledWithTheRun) {
  LoopbackListener silent;
  ShardConnection connection(0, silent.address(), ConnectionOptions{});
  ShardFanOut fanout({&connection});
  RunCanceller canceller;
  ShardFanOut::Call call;
  call.what = "re-sending hyperparameter changes";
  call.attempt_timeout = absl::Seconds(60);
  call.retryable = [](const absl::Status&) { return false; };
  call.canceller = &canceller;
  absl::Notification sending, ended;
  absl::Status result;
  std::thread runner([&] {
    result = fanout.Run(call, [&](ShardConnection& shard, grpc::ClientContext&) {
      ShardFanOut::FollowUpContext follow_up(absl::Seconds(60));
      sending.Notify();
      return shard.SetHyperparameters(follow_up.get(), v1::SetHyperparametersRequest());
    });
    ended.Notify();
  });
  ASSERT_TRUE(sending.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_FALSE(ended.WaitForNotificationWithTimeout(absl::Milliseconds(500)))
      << "the call did not wait (" << result << "): the test needs one that does";
  const absl::Time cancelled = absl::Now();
  canceller.Cancel();
  EXPECT_TRUE(ended.WaitForNotificationWithTimeout(absl::Seconds(10)));
  runner.join();
  EXPECT_LT(absl::Now() - cancelled, absl::Seconds(2));
  EXPECT_EQ(result.code(), absl::StatusCode::kCancelled) << result;
}

}  // namespace
}  // namespace shardopt
