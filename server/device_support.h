// Where a shard server keeps and updates its models: --device resolution and
// the GPU backend factory. Two implementations: device_support_cuda.cc where
// the build has CUDA (nvcc found), device_support_nocuda.cc elsewhere.
#ifndef SHARDOPT_SERVER_DEVICE_SUPPORT_H_
#define SHARDOPT_SERVER_DEVICE_SUPPORT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/model_shard.h"
#include "server/update_backend.h"

namespace shardopt {

struct DeviceSelection {
  int gpu_index = -1;         // -1: the CPU.
  std::string description;    // "cpu", "cuda:0 NVIDIA H200 (sm_90, ...)".
  std::string note;           // Why `auto` or a fallback chose the CPU, if it did.
  uint64_t memory_bytes = 0;  // The GPU's memory (the default state budget); 0 for the CPU.
};

// Resolves --device:
//   "cpu"          the CPU;
//   "auto"         the first usable GPU, else the CPU (note says why);
//   "cuda[:N]"     exactly that GPU; when it is not usable: an error naming
//                  the reason (UNAVAILABLE, NOT_FOUND, FAILED_PRECONDITION,
//                  UNIMPLEMENTED in a build without CUDA), or the CPU with a
//                  note when `fallback_to_cpu`.
// INVALID_ARGUMENT for anything else.
absl::StatusOr<DeviceSelection> SelectShardDevice(absl::string_view device, bool fallback_to_cpu);

// A backend for one model shard on GPU `gpu_index` (from SelectShardDevice).
absl::StatusOr<std::unique_ptr<UpdateBackend>> MakeGpuBackend(int gpu_index,
                                                              const ModelShardOptions& options,
                                                              const std::vector<float>& initial);

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_DEVICE_SUPPORT_H_
