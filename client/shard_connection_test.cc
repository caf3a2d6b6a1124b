// ShardConnection under overlapping calls: a pull's wait check probes every
// shard from another shard's worker thread while that shard's own worker
// reopens its channel after failed connects. Each call must keep the
// channel (stub, methods) it started on; before, a reopen freed them under
// the other thread's call.
#include "client/shard_connection.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace shardopt {
namespace {

// Nothing listens there: connects are refused at once.
constexpr char kAddress[] = "127.0.0.1:1";

TEST(ShardConnectionTest, CallsOfTwoThreadsOverlapWithReopens) {
  ConnectionOptions options;
  options.initial_backoff = absl::Milliseconds(1);
  ShardConnection shard(0, kAddress, options);
  shard.set_range({0, 8});

  std::atomic<int64_t> attempts{0};
  std::atomic<int64_t> unexpected{0};
  const absl::Time end = absl::Now() + absl::Seconds(2);
  // What a worker does per attempt: reopen if asked, one call, record it.
  auto worker = [&](bool pull) {
    while (absl::Now() < end) {
      shard.PrepareAttempt();
      auto context = std::make_unique<grpc::ClientContext>();
      context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(200)));
      absl::Status s;
      if (pull) {
        v1::PullParametersRequest request;
        request.set_model_id("m");
        request.set_wait_only(true);
        PulledVersion pulled;
        s = shard.Pull(*context, request, DType::kFloat32, nullptr, &pulled);
      } else {
        v1::InspectResponse response;
        s = shard.Inspect(*context, v1::InspectRequest(), &response);
      }
      if (!absl::IsUnavailable(s) && !absl::IsDeadlineExceeded(s)) unexpected.fetch_add(1);
      shard.RecordAttempt(s, /*deadline_passed=*/absl::IsDeadlineExceeded(s));
      attempts.fetch_add(1);
    }
  };
  std::vector<std::thread> threads;
  threads.emplace_back(worker, true);
  threads.emplace_back(worker, true);
  threads.emplace_back(worker, false);
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_GT(attempts.load(), 3);
  EXPECT_EQ(shard.unreachable_attempts(), attempts.load());
}

}  // namespace
}  // namespace shardopt
