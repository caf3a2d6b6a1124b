// FindDevicePairKind in a build with CUDA: loopback pairs, and NCCL pairs
// where libnccl loads at run time.
#include "absl/strings/str_cat.h"
#include "common/device_pair.h"
#include "common/loopback_pair.h"
#include "common/nccl/nccl_pair.h"

namespace shardopt {

absl::StatusOr<const DevicePairKind*> FindDevicePairKind(absl::string_view name) {
  if (name == "loopback") return &LoopbackPairKind();
  if (name == "nccl") {
    if (absl::Status s = nccl::NcclPair::Available(); !s.ok()) return s;
    return &nccl::NcclPairKind();
  }
  return absl::NotFoundError(
      absl::StrCat("no device pair kind '", name, "' (kinds: nccl, loopback)"));
}

}  // namespace shardopt
