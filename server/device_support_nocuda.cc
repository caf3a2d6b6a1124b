// device_support.h for builds without CUDA: only the CPU exists.
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/device_support.h"

namespace shardopt {

absl::StatusOr<DeviceSelection> SelectShardDevice(absl::string_view device, bool fallback_to_cpu) {
  DeviceSelection cpu{-1, "cpu", ""};
  if (device == "cpu") return cpu;
  if (device == "auto") {
    cpu.note = "this build has no CUDA backend (nvcc was not found when it was built)";
    return cpu;
  }
  if (device == "cuda" || absl::StartsWith(device, "cuda:")) {
    const std::string why = absl::StrCat("--device=", device,
                                         ": this build has no CUDA backend (nvcc was not "
                                         "found when it was built)");
    if (!fallback_to_cpu) return absl::UnimplementedError(why);
    cpu.note = why;
    return cpu;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--device=", device, " is not cpu, auto, cuda or cuda:N"));
}

absl::StatusOr<std::unique_ptr<UpdateBackend>> MakeGpuBackend(int, const ModelShardOptions&,
                                                              const std::vector<float>&) {
  return absl::UnimplementedError("this build has no CUDA backend");
}

}  // namespace shardopt
