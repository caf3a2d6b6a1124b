// FindDevicePairKind in a build without CUDA: loopback pairs only.
#include "absl/strings/str_cat.h"
#include "common/device_pair.h"
#include "common/loopback_pair.h"

namespace shardopt {

absl::StatusOr<const DevicePairKind*> FindDevicePairKind(absl::string_view name) {
  if (name == "loopback") return &LoopbackPairKind();
  if (name == "nccl") {
    return absl::UnimplementedError(
        "NCCL device pairs: this build has no CUDA (nvcc was not found when it was built)");
  }
  return absl::NotFoundError(
      absl::StrCat("no device pair kind '", name, "' (kinds: nccl, loopback)"));
}

}  // namespace shardopt
