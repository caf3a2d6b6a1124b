#include "common/consistency.h"

#include "absl/strings/str_cat.h"

namespace shardopt {

const char* ConsistencyName(Consistency consistency) {
  switch (consistency) {
    case Consistency::kSync:
      return "sync";
    case Consistency::kAsync:
      return "async";
    case Consistency::kBounded:
      return "bounded";
  }
  return "unknown";
}

absl::StatusOr<Consistency> ConsistencyFromName(absl::string_view name) {
  for (Consistency c : {Consistency::kSync, Consistency::kAsync, Consistency::kBounded}) {
    if (name == ConsistencyName(c)) return c;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("consistency '", name, "' is not one of sync, async, bounded"));
}

absl::Status CheckConsistency(Consistency consistency, int64_t staleness) {
  if (consistency == Consistency::kBounded && staleness < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("bounded staleness needs a staleness of at least 1, not ", staleness));
  }
  if (consistency != Consistency::kBounded && staleness != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a staleness (", staleness,
                                                   ") is only for bounded consistency, not ",
                                                   ConsistencyName(consistency)));
  }
  return absl::OkStatus();
}

bool ShardsDecideSteps(Consistency consistency, double max_grad_norm, bool loss_scaling) {
  return !IsAsynchronous(consistency) && (max_grad_norm > 0 || loss_scaling);
}

}  // namespace shardopt
