// PeerProcess's plumbing, which runs without a GPU: an nccl_peer given an
// unknown mode exits 2 before any CUDA or NCCL call and is reported so; a
// binary that does not exist is not started. argv[1]: the nccl_peer binary.
#include "common/nccl/peer_process.h"

#include <unistd.h>

#include <string>

#include "gtest/gtest.h"

namespace shardopt::nccl {
namespace {

std::string g_peer_binary;

TEST(PeerProcessTest, ABadCommandLineEndsThePeerAndSaysHow) {
  PeerProcess peer(g_peer_binary, std::string(128, 'x'), "nonsense", {1}, "shardopt-test-peer");
  ASSERT_TRUE(peer.started());
  std::string how;
  for (int i = 0; i < 1000 && how.empty(); ++i) {  // At most 10 s.
    how = peer.ExitedHow();
    if (how.empty()) usleep(10000);
  }
  EXPECT_EQ(how, "the peer exited with 2");
  EXPECT_EQ(peer.ExitedHow(), "");  // Reaped once.
}

TEST(PeerProcessTest, AMissingBinaryIsNotStarted) {
  PeerProcess peer("/nonexistent/nccl_peer", std::string(128, 'x'), "echo", {}, "h");
  EXPECT_FALSE(peer.started());
}

}  // namespace
}  // namespace shardopt::nccl

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (argc > 1) shardopt::nccl::g_peer_binary = argv[1];
  return RUN_ALL_TESTS();
}
