// What the parts of one checkpoint must agree on, read by the writer that
// commits the manifest and by the reader that opens it (a checkpoint is
// committed only as it will be read), and what may differ between them.
#ifndef SHARDOPT_COMMON_CHECKPOINT_AGREEMENT_H_
#define SHARDOPT_COMMON_CHECKPOINT_AGREEMENT_H_

#include "proto/shardopt/v1/checkpoint.pb.h"

namespace shardopt {

// Whether each part of `config`'s checkpoints holds its own shard's optimizer
// step and skip counts (asynchronous and bounded modes, where a shard may
// have skipped a trainer's step another applied), which may then differ
// between parts; a restore of that shard's range takes its own.
bool StepCountsPerShard(const v1::ModelConfig& config);

// Whether every part of `manifest` counts the same optimizer steps and skips
// (always so in synchronous mode). When not, anything that merges the parts
// (a restore onto other ranges, an export) takes part 0's counts.
bool PartsCountStepsAlike(const v1::CheckpointManifest& manifest);

// Whether two parts of `config`'s checkpoint saved the same state: equal
// but for their own statistics, hyperparameter changes scheduled for
// different later steps, and (StepCountsPerShard) their step counts.
bool SameProgress(const v1::CheckpointProgress& a, const v1::CheckpointProgress& b,
                  const v1::ModelConfig& config);

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_CHECKPOINT_AGREEMENT_H_
