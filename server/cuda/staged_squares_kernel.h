// Internal to //server/cuda, device code: the kernel that runs a
// lane_squares_body.h Job, a warp per 32 runs with its tile in shared
// memory, and its launch. Included by the .cu files of the passes that sum
// squares over runs (LAMB's measure pass, Adafactor's pieces and rows).
#ifndef SHARDOPT_SERVER_CUDA_STAGED_SQUARES_KERNEL_H_
#define SHARDOPT_SERVER_CUDA_STAGED_SQUARES_KERNEL_H_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "server/cuda/lane_squares_body.h"
#include "server/cuda/launch_util.h"

namespace shardopt {
namespace gpu {
namespace staged {

// Four warps a block: a tile of two values is about 9.5 KiB a warp.
inline constexpr int kWarpsPerBlock = 4;

template <typename Job>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) StagedSquaresKernel(const Job job) {
  namespace body = internal::body;
  __shared__ body::StagedTile<Job::kValues> tiles[kWarpsPerBlock];
  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  body::StagedTile<Job::kValues>& tile = tiles[warp];
  const size_t warps = static_cast<size_t>(gridDim.x) * kWarpsPerBlock;
  for (size_t w = static_cast<size_t>(blockIdx.x) * kWarpsPerBlock + warp;
       w * body::kStagedRuns < job.runs(); w += warps) {
    const size_t first_run = w * body::kStagedRuns;
    body::LaneSum sums[Job::kValues];
    body::StagedBegin(job, first_run, lane, tile, sums);
    __syncwarp();
    const uint64_t chunks = body::StagedChunks(tile);
    for (uint64_t chunk = 0; chunk < chunks; ++chunk) {
      body::StagedStage(job, chunk, lane, tile);
      __syncwarp();
      body::StagedConsume(job, first_run, chunk, lane, tile, sums);
      __syncwarp();
    }
    // The next warp's Begin rewrites tile.runs, which StagedChunks read
    // (no chunk barrier ran when every run was empty).
    __syncwarp();
  }
}

template <typename Job>
absl::Status LaunchStagedSquares(const Job& job, cudaStream_t stream, const char* what) {
  if (job.runs() == 0) return absl::OkStatus();
  const size_t warps = (job.runs() + internal::body::kStagedRuns - 1) / internal::body::kStagedRuns;
  size_t blocks = (warps + kWarpsPerBlock - 1) / kWarpsPerBlock;
  if (blocks > size_t{65535} * 32) blocks = size_t{65535} * 32;
  StagedSquaresKernel<Job><<<static_cast<unsigned>(blocks), kWarpsPerBlock * 32, 0, stream>>>(job);
  return launch::Check(cudaGetLastError(), what);
}

}  // namespace staged
}  // namespace gpu
}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CUDA_STAGED_SQUARES_KERNEL_H_
