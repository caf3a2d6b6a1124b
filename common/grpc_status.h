// Conversions between grpc::Status and absl::Status. The two share their
// numeric codes, so the mapping is exact in both directions.
#ifndef SHARDOPT_COMMON_GRPC_STATUS_H_
#define SHARDOPT_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace shardopt {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

inline absl::Status ToAbslStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_GRPC_STATUS_H_
