// Internal to //server/cuda, tests only: the fused kernels' launchers
// (fused_kernels.h) implemented on the host. fused_kernels_emulated.cc runs
// the same per-thread code as the device (fused_kernel_body.h) for every
// thread of a simulated grid, one thread after another, on host memory: a
// library built from fused_optimizers.cc and it (":gpu_emulated") makes
// FusedOptimizerStep, ConvertToBf16 and InitializeOptimizerState work on host
// pointers without a GPU. It checks the host-side scalars and plan, the
// indexing (head / float4 groups / tail, grid-stride loops) and the operation
// order; not the GPU's arithmetic or memory system.
#ifndef SHARDOPT_SERVER_CUDA_FUSED_KERNELS_EMULATED_H_
#define SHARDOPT_SERVER_CUDA_FUSED_KERNELS_EMULATED_H_

#include <cstddef>

namespace shardopt {
namespace gpu {
namespace internal {

// The simulated grid's thread count for the following launches; 0 (the
// default) sizes it as the device would for an H200 (132 SMs, 6 resident
// blocks of 256 threads each, fewer if the range needs fewer). Rounded up to
// whole blocks of kThreadsPerBlock.
void SetEmulatedGridThreads(size_t threads);

}  // namespace internal
}  // namespace gpu
}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CUDA_FUSED_KERNELS_EMULATED_H_
