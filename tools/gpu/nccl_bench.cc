// nccl_bench: the NCCL data plane's raw speed between two processes on one
// GPU, as tools/gpu_check.sh runs it on the lent H200: this process (rank
// 0) and an nccl_peer (rank 1) in echo mode, each its own NCCL_HOSTID, so
// NCCL's socket transport over loopback carries the bytes (as between a
// trainer and a shard on one host without P2P).
//
//   nccl_bench --peer=PATH/nccl_peer [--sizes_mib=64,256] [--iters=10]
//
// For each size: one untimed round trip, then --iters timed ones (send N
// bytes, receive them back, wall time to the end of the receive), and the
// median; next to it a device-to-device cudaMemcpy of the same bytes both
// ways in one process (the ceiling no transport beats), timed before the
// peer starts. Last lines:
//   RESULT kind=nccl_round_trip n=<bytes> median_ms=<..> gbps=<both directions>
//   RESULT kind=d2d_copy_both_ways n=<bytes> median_ms=<..> gbps=<..>
// Exit status: 0, 3 when there is no usable GPU or no NCCL (why on
// stderr), 1 on any other error. A benchmark, not a test: it asserts only
// that the bytes come back.
#include <cuda_runtime_api.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/nccl/loopback_environment.h"
#include "common/nccl/nccl_pair.h"
#include "common/nccl/peer_process.h"

ABSL_FLAG(std::string, peer, "", "The nccl_peer binary.");
ABSL_FLAG(std::vector<std::string>, sizes_mib, std::vector<std::string>({"64", "256"}),
          "Transfer sizes in MiB.");
ABSL_FLAG(int, iters, 10, "Timed round trips per size.");

namespace {

int Fail(const std::string& what) {
  fprintf(stderr, "nccl_bench: %s\n", what.c_str());
  return 1;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    fprintf(stderr, "nccl_bench: no usable CUDA GPU\n");
    return 3;
  }
  if (absl::Status s = shardopt::nccl::NcclPair::Available(); !s.ok()) {
    fprintf(stderr, "nccl_bench: %s\n", s.ToString().c_str());
    return 3;
  }
  setenv("NCCL_HOSTID", "shardopt-nccl-bench-rank0", 1);
  shardopt::nccl::UseNcclOverLoopback();
  const int iters = std::max(1, absl::GetFlag(FLAGS_iters));
  std::vector<size_t> sizes;
  for (const std::string& text : absl::GetFlag(FLAGS_sizes_mib)) {
    size_t mib = 0;
    if (!absl::SimpleAtoi(text, &mib) || mib == 0) return Fail("bad --sizes_mib");
    sizes.push_back(mib << 20);
  }
  const size_t largest = *std::max_element(sizes.begin(), sizes.end());
  void *out = nullptr, *in = nullptr;
  if (cudaMalloc(&out, largest) != cudaSuccess || cudaMalloc(&in, largest) != cudaSuccess) {
    return Fail("cudaMalloc");
  }
  cudaMemset(out, 0x3c, largest);
  cudaDeviceSynchronize();
  // The copies first, before the peer exists: an echoing peer keeps its next
  // receive posted, and NCCL's kernel for it spins on this same GPU (on the
  // first H200 run that made the 64 MiB copies 9x slower than the 256 MiB
  // ones, timed after the peer had finished).
  std::vector<double> copy_ms;
  for (size_t n : sizes) {
    std::vector<double> copies;
    for (int k = 0; k <= iters; ++k) {
      const absl::Time start = absl::Now();
      cudaMemcpy(in, out, n, cudaMemcpyDeviceToDevice);
      cudaMemcpy(out, in, n, cudaMemcpyDeviceToDevice);
      if (cudaDeviceSynchronize() != cudaSuccess) return Fail("the device-to-device copy");
      if (k > 0) copies.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    }
    copy_ms.push_back(Median(copies));
  }
  cudaMemset(in, 0, largest);
  cudaDeviceSynchronize();
  // The peer echoes every transfer of the run, in order.
  std::vector<size_t> transfers;
  for (size_t n : sizes) transfers.insert(transfers.end(), iters + 1, n);
  absl::StatusOr<std::string> id = shardopt::nccl::NcclPair::NewUniqueId();
  if (!id.ok()) return Fail(id.status().ToString());
  shardopt::nccl::PeerProcess peer(absl::GetFlag(FLAGS_peer), *id, "echo", transfers,
                                   "shardopt-nccl-bench-rank1");
  if (!peer.started()) return Fail("cannot start --peer " + absl::GetFlag(FLAGS_peer));
  absl::StatusOr<std::unique_ptr<shardopt::nccl::NcclPair>> pair =
      shardopt::nccl::NcclPair::Connect(*id, 0, 0, absl::Now() + absl::Seconds(20), "nccl_peer");
  if (!pair.ok()) return Fail(pair.status().ToString() + "; " + peer.ExitedHow());
  std::vector<std::string> lines;
  for (size_t index = 0; index < sizes.size(); ++index) {
    const size_t n = sizes[index];
    std::vector<double> round_trips;
    for (int k = 0; k <= iters; ++k) {
      const absl::Time deadline = absl::Now() + absl::Seconds(20);
      const absl::Time start = absl::Now();
      absl::Status s = (*pair)->Send(out, n, deadline, "the bench's send");
      if (s.ok()) s = (*pair)->Recv(in, n, deadline, "the bench's receive");
      if (!s.ok()) return Fail(s.ToString() + "; " + peer.ExitedHow());
      if (k > 0) round_trips.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    }
    unsigned char first = 0, last = 0;
    cudaMemcpy(&first, in, 1, cudaMemcpyDeviceToHost);
    cudaMemcpy(&last, static_cast<char*>(in) + n - 1, 1, cudaMemcpyDeviceToHost);
    if (first != 0x3c || last != 0x3c) return Fail("the bytes came back changed");
    const double nccl_ms = Median(round_trips);
    const double gb = 2.0 * static_cast<double>(n) / 1e9;
    printf(
        "%4zu MiB: NCCL round trip %.3f ms (%.2f GB/s both ways), D2D copy both ways %.3f ms "
        "(%.1f GB/s): NCCL at %.1f%% of the copy\n",
        n >> 20, nccl_ms, gb / (nccl_ms / 1e3), copy_ms[index], gb / (copy_ms[index] / 1e3),
        100.0 * copy_ms[index] / nccl_ms);
    lines.push_back(absl::StrCat("RESULT kind=nccl_round_trip n=", n, " median_ms=", nccl_ms,
                                 " gbps=", gb / (nccl_ms / 1e3)));
    lines.push_back(absl::StrCat("RESULT kind=d2d_copy_both_ways n=", n,
                                 " median_ms=", copy_ms[index],
                                 " gbps=", gb / (copy_ms[index] / 1e3)));
  }
  pair->reset();
  const int status = peer.Wait();
  for (const std::string& line : lines) printf("%s\n", line.c_str());
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return Fail("nccl_peer did not finish cleanly");
  return 0;
}
