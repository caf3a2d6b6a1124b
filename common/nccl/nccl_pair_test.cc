// NcclPair between this process (rank 0) and an nccl_peer process (rank 1)
// on the same GPU, each with its own NCCL_HOSTID: bytes cross both ways
// intact, and a peer that dies mid-transfer, dies after joining, stalls, or
// never joins makes the call fail within its deadline (not hang) and breaks
// the pair. Skips, saying why, without a GPU or without NCCL; argument
// checks run everywhere. argv[1]: the nccl_peer binary.
#include "common/nccl/nccl_pair.h"

#include <cuda_runtime_api.h>
#include <sys/wait.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/nccl/loopback_environment.h"
#include "common/nccl/peer_process.h"
#include "gtest/gtest.h"

namespace shardopt::nccl {
namespace {

std::string g_peer_binary;

// Why these tests cannot run here; empty when they can.
std::string WhyNot() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess)
    return absl::StrCat("no CUDA GPU here (", cudaGetErrorString(error), ")");
  if (count == 0) return "no CUDA GPU here";
  if (absl::Status s = NcclPair::Available(); !s.ok()) return std::string(s.message());
  return "";
}

#define SKIP_WITHOUT_GPU_AND_NCCL()                    \
  do {                                                 \
    const std::string why = WhyNot();                  \
    if (!why.empty()) GTEST_SKIP() << "SKIP: " << why; \
  } while (0)

// The peer as a child process with its own NCCL_HOSTID.
class Peer : public PeerProcess {
 public:
  Peer(const std::string& unique_id, const std::string& mode, const std::vector<size_t>& bytes)
      : PeerProcess(g_peer_binary, unique_id, mode, bytes, "shardopt-nccl-test-peer") {}
};

void* DeviceBuffer(size_t bytes) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, bytes), cudaSuccess);
  return p;
}

TEST(NcclPairTest, BadArgumentsAreRefusedBeforeAnyNcclCall) {
  absl::StatusOr<std::unique_ptr<NcclPair>> pair =
      NcclPair::Connect("short", 0, 0, absl::Now() + absl::Seconds(1), "nobody");
  EXPECT_EQ(pair.status().code(), absl::StatusCode::kInvalidArgument) << pair.status();
  pair = NcclPair::Connect(std::string(kUniqueIdBytes, 'x'), 2, 0, absl::Now(), "nobody");
  EXPECT_EQ(pair.status().code(), absl::StatusCode::kInvalidArgument) << pair.status();
}

TEST(NcclPairTest, BytesCrossBothWaysIntact) {
  SKIP_WITHOUT_GPU_AND_NCCL();
  const std::string id = NcclPair::NewUniqueId().value();
  // Odd sizes: not multiples of any vector width or NCCL chunk.
  const std::vector<size_t> sizes = {12345, (size_t{64} << 20) + 3};
  Peer peer(id, "echo", sizes);
  ASSERT_TRUE(peer.started());
  absl::StatusOr<std::unique_ptr<NcclPair>> pair =
      NcclPair::Connect(id, 0, 0, absl::Now() + absl::Seconds(20), "nccl_peer (rank 1)");
  ASSERT_TRUE(pair.ok()) << pair.status() << "; " << peer.ExitedHow();
  for (size_t n : sizes) {
    std::vector<unsigned char> sent(n), back(n);
    for (size_t i = 0; i < n; ++i) sent[i] = static_cast<unsigned char>((i * 131 + n) % 251);
    void* out = DeviceBuffer(n);
    void* in = DeviceBuffer(n);
    ASSERT_EQ(cudaMemcpy(out, sent.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    absl::Status s = (*pair)->Send(out, n, deadline, "the echo's request");
    ASSERT_TRUE(s.ok()) << s << "; " << peer.ExitedHow();
    s = (*pair)->Recv(in, n, deadline, "the echo's answer");
    ASSERT_TRUE(s.ok()) << s << "; " << peer.ExitedHow();
    ASSERT_EQ(cudaMemcpy(back.data(), in, n, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_TRUE(sent == back) << n << " bytes came back changed";
    cudaFree(out);
    cudaFree(in);
  }
  const int status = peer.Wait();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

// A dead or stalled peer: the call ends by its deadline (plus NCCL's abort),
// says what it waited for, and the pair stays broken.
void ExpectFailsInTime(const std::string& mode, absl::Duration within, absl::StatusCode expected) {
  const std::string id = NcclPair::NewUniqueId().value();
  const size_t bytes = size_t{256} << 20;
  Peer peer(id, mode, {bytes});
  ASSERT_TRUE(peer.started());
  absl::StatusOr<std::unique_ptr<NcclPair>> pair =
      NcclPair::Connect(id, 0, 0, absl::Now() + absl::Seconds(20), "nccl_peer (rank 1)");
  ASSERT_TRUE(pair.ok()) << pair.status() << "; " << peer.ExitedHow();
  void* in = DeviceBuffer(bytes);
  if (mode == "die_mid_send") {
    // The peer's warm-up: NCCL connects lazily, so the death is mid-transfer.
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    absl::Status s = (*pair)->Send(in, 16, deadline, "the warm-up's send");
    ASSERT_TRUE(s.ok()) << s << "; " << peer.ExitedHow();
    s = (*pair)->Recv(in, 16, deadline, "the warm-up's receive");
    ASSERT_TRUE(s.ok()) << s << "; " << peer.ExitedHow();
  }
  const absl::Time start = absl::Now();
  const absl::Status s =
      (*pair)->Recv(in, bytes, start + within, "the push of trainer 1 step 7 to shard 0");
  const absl::Duration took = absl::Now() - start;
  if (expected != absl::StatusCode::kOk) {
    EXPECT_EQ(s.code(), expected) << s;
  } else {  // Dead: NCCL may notice the socket close, or only the deadline.
    EXPECT_TRUE(s.code() == absl::StatusCode::kUnavailable ||
                s.code() == absl::StatusCode::kDeadlineExceeded)
        << s;
  }
  EXPECT_NE(s.message().find("the push of trainer 1 step 7 to shard 0"), std::string::npos) << s;
  EXPECT_LT(took, within + absl::Seconds(5)) << mode << ": " << s;
  EXPECT_FALSE((*pair)->broken().ok());
  // Later calls fail at once.
  const absl::Time again = absl::Now();
  const absl::Status later = (*pair)->Send(in, 16, absl::Now() + absl::Seconds(30), "a later push");
  EXPECT_FALSE(later.ok());
  EXPECT_NE(later.message().find("failed before"), std::string::npos) << later;
  EXPECT_LT(absl::Now() - again, absl::Milliseconds(100));
  pair->reset();  // Ends without hanging.
  cudaFree(in);
  printf("%s: %s after %s\n", mode.c_str(), s.ToString().c_str(),
         absl::FormatDuration(took).c_str());
}

TEST(NcclPairTest, APeerKilledMidTransferFailsTheCallInTime) {
  SKIP_WITHOUT_GPU_AND_NCCL();
  // (NCCL may see the socket close, UNAVAILABLE, or only the deadline.)
  ExpectFailsInTime("die_mid_send", absl::Seconds(10), absl::StatusCode::kOk);
}

TEST(NcclPairTest, APeerKilledAfterJoiningFailsTheCallInTime) {
  SKIP_WITHOUT_GPU_AND_NCCL();
  ExpectFailsInTime("die_after_join", absl::Seconds(10), absl::StatusCode::kOk);
}

TEST(NcclPairTest, AStalledPeerIsAbortedAtTheDeadline) {
  SKIP_WITHOUT_GPU_AND_NCCL();
  ExpectFailsInTime("stall", absl::Seconds(3), absl::StatusCode::kDeadlineExceeded);
}

TEST(NcclPairTest, APeerThatNeverJoinsTimesOutTheConnect) {
  SKIP_WITHOUT_GPU_AND_NCCL();
  const std::string id = NcclPair::NewUniqueId().value();
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<NcclPair>> pair =
      NcclPair::Connect(id, 0, 0, start + absl::Seconds(3), "trainer 1 of model m");
  EXPECT_EQ(pair.status().code(), absl::StatusCode::kDeadlineExceeded) << pair.status();
  EXPECT_NE(pair.status().message().find("trainer 1 of model m"), std::string::npos)
      << pair.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(8));
}

}  // namespace
}  // namespace shardopt::nccl

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc > 1) shardopt::nccl::g_peer_binary = argv[1];
  // This process is one "host", the peer another (see nccl_pair.h).
  setenv("NCCL_HOSTID", "shardopt-nccl-test-rank0", 1);
  // (The peer inherits it.)
  shardopt::nccl::UseNcclOverLoopback();
  return RUN_ALL_TESTS();
}
