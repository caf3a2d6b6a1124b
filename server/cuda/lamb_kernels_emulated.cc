// lamb_kernels.h on HOST memory, for tests: lamb_kernel_body.h's per-thread
// code run for every thread of a simulated grid of launch_util.h's shape
// (one thread after another), as fused_kernels_emulated.cc does for the
// fused kernels. Never link it together with the real kernels (:lamb).
#include <algorithm>

#include "server/cuda/lamb_kernel_body.h"
#include "server/cuda/lamb_kernels.h"

namespace shardopt {
namespace gpu {
namespace {

// The device's grid for `work` items (launch_util.h's Blocks of 256
// threads, capped as there), run thread by thread.
template <typename F>
void RunGrid(size_t work, F thread) {
  constexpr size_t kThreads = 256;
  const size_t blocks =
      std::min<size_t>(std::max<size_t>(1, (work + kThreads - 1) / kThreads), size_t{65535} * 32);
  const size_t threads = blocks * kThreads;
  for (size_t tid = 0; tid < threads; ++tid) thread(tid, threads);
}

}  // namespace

absl::Status LambMeasure(const LambMeasureArgs& a, void*) {
  internal::body::RunStagedSquaresOnHost(internal::body::LambMeasureJob{a});
  return absl::OkStatus();
}

absl::Status LambApply(const LambApplyArgs& a, void*) {
  if (a.num_blocks == 0) return absl::OkStatus();
  RunGrid(a.num_blocks * kLambBlockElements,
          [&](size_t tid, size_t threads) { internal::body::LambApplyThread(a, tid, threads); });
  return absl::OkStatus();
}

}  // namespace gpu
}  // namespace shardopt
