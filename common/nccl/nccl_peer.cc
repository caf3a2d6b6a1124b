// The other rank of an NcclPair for nccl_pair_test: joins the pair named by
// --unique_id (hex) as rank 1 on cuda:0, then plays one part:
//   echo             receives each of --bytes and sends it back;
//   die_after_join   kills itself with SIGKILL once joined;
//   die_mid_send     echoes 16 bytes (so that NCCL's lazy connection is up),
//                    starts sending --bytes, then kills itself mid-transfer;
//   stall            joins, then sleeps (the test kills it).
// Exit 0 after echo; 2 on a bad command line; 1 with the reason on stderr.
#include <cuda_runtime_api.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "common/nccl/nccl_pair.h"

ABSL_FLAG(std::string, unique_id, "", "The pair's NCCL unique id, hex.");
ABSL_FLAG(std::string, mode, "echo", "echo | die_after_join | die_mid_send | stall");
ABSL_FLAG(std::vector<std::string>, bytes, {}, "Transfer sizes in bytes.");

namespace {

int Fail(const absl::Status& status) {
  fprintf(stderr, "nccl_peer: %s\n", status.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string id = absl::HexStringToBytes(absl::GetFlag(FLAGS_unique_id));
  std::vector<size_t> sizes;
  for (const std::string& text : absl::GetFlag(FLAGS_bytes)) {
    size_t n = 0;
    if (!absl::SimpleAtoi(text, &n)) return 2;
    sizes.push_back(n);
  }
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode != "echo" && mode != "die_after_join" && mode != "die_mid_send" && mode != "stall") {
    fprintf(stderr, "nccl_peer: unknown --mode=%s\n", mode.c_str());
    return 2;
  }
  absl::StatusOr<std::unique_ptr<shardopt::nccl::NcclPair>> pair =
      shardopt::nccl::NcclPair::Connect(id, 1, 0, absl::Now() + absl::Seconds(20),
                                        "the test (rank 0)");
  if (!pair.ok()) return Fail(pair.status());
  if (mode == "die_after_join") raise(SIGKILL);
  if (mode == "stall") {
    std::this_thread::sleep_for(std::chrono::seconds(600));
    return 1;
  }
  size_t largest = 1;
  for (size_t n : sizes) largest = std::max(largest, n);
  void* buffer = nullptr;
  if (cudaMalloc(&buffer, largest) != cudaSuccess) return Fail(absl::InternalError("cudaMalloc"));
  cudaMemset(buffer, 0x5a, largest);
  cudaDeviceSynchronize();
  if (mode == "die_mid_send") {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    if (absl::Status s = (*pair)->Recv(buffer, 16, deadline, "the warm-up's receive"); !s.ok()) {
      return Fail(s);
    }
    if (absl::Status s = (*pair)->Send(buffer, 16, deadline, "the warm-up's send"); !s.ok()) {
      return Fail(s);
    }
    std::thread sender([&] {
      (*pair)->Send(buffer, largest, absl::Now() + absl::Seconds(20), "sending").IgnoreError();
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(3));
    raise(SIGKILL);
  }
  if (mode != "echo") return 2;
  for (size_t n : sizes) {
    const absl::Time deadline = absl::Now() + absl::Seconds(20);
    if (absl::Status s = (*pair)->Recv(buffer, n, deadline, "echo's receive"); !s.ok()) {
      return Fail(s);
    }
    if (absl::Status s = (*pair)->Send(buffer, n, deadline, "echo's send"); !s.ok()) {
      return Fail(s);
    }
  }
  pair->reset();
  cudaFree(buffer);
  return 0;
}
