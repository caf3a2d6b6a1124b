// Conversions between the wire contract (proto/shardopt/v1) and the plain
// C++ types of common/. Validation happens here, once, for both sides.
#ifndef SHARDOPT_COMMON_PROTO_CONVERT_H_
#define SHARDOPT_COMMON_PROTO_CONVERT_H_

#include "absl/status/statusor.h"
#include "common/consistency.h"
#include "common/dtype.h"
#include "common/layout.h"
#include "common/lr_schedule.h"
#include "common/optimizer_config.h"
#include "common/step_protocol.h"
#include "proto/shardopt/v1/shard_service.pb.h"

namespace shardopt {

// INVALID_ARGUMENT for an invalid layout (see ModelLayout::Create).
absl::StatusOr<ModelLayout> LayoutFromProto(const v1::Layout& proto, uint32_t shard_count);
v1::Layout LayoutToProto(const ModelLayout& layout);

// INVALID_ARGUMENT when no optimizer is set or a hyperparameter is invalid.
absl::StatusOr<OptimizerConfig> OptimizerConfigFromProto(const v1::OptimizerConfig& proto);
v1::OptimizerConfig OptimizerConfigToProto(const OptimizerConfig& config);

// INVALID_ARGUMENT for unknown enum values or an invalid schedule.
absl::StatusOr<LrSchedule> LrScheduleFromProto(const v1::LrSchedule& proto);
v1::LrSchedule LrScheduleToProto(const LrSchedule& schedule);

// DTYPE_UNSPECIFIED maps to kFloat32; unknown values are INVALID_ARGUMENT.
absl::StatusOr<DType> DTypeFromProto(v1::DType proto);
v1::DType DTypeToProto(DType dtype);

// Field for field (checked where they are used: CheckDecision).
// INVALID_ARGUMENT for a trust partial with a negative or non-finite part.
absl::StatusOr<StepStats> StepStatsFromProto(const v1::StepStats& proto);
v1::StepStats StepStatsToProto(const StepStats& stats);
StepDecision StepDecisionFromProto(const v1::StepDecision& proto);
v1::StepDecision StepDecisionToProto(const StepDecision& decision);

// INVALID_ARGUMENT for an unknown mode, or settings that do not go together
// (CheckConsistency).
absl::StatusOr<Consistency> ConsistencyFromConfig(const v1::ModelConfig& config);
v1::Consistency ConsistencyToProto(Consistency consistency);

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_PROTO_CONVERT_H_
