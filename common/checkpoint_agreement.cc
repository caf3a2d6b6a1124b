#include "common/checkpoint_agreement.h"

#include "google/protobuf/util/message_differencer.h"

namespace shardopt {

bool StepCountsPerShard(const v1::ModelConfig& config) {
  return config.consistency() != v1::CONSISTENCY_SYNC;
}

bool PartsCountStepsAlike(const v1::CheckpointManifest& manifest) {
  for (const v1::CheckpointPart& part : manifest.parts()) {
    const v1::CheckpointProgress& first = manifest.parts(0).progress();
    if (part.progress().optimizer_steps() != first.optimizer_steps() ||
        part.progress().skipped_steps() != first.skipped_steps()) {
      return false;
    }
  }
  return true;
}

// Whether two parts saved the same state (their own statistics aside).
// Changes scheduled for later steps may differ by what reached each shard
// before it wrote its part (trainers send a change while the shards save a
// step): only two different changes for the same step disagree. A restore
// takes them all (ScheduledChangesOf).
// Asynchronous modes count each shard's optimizer steps and skips on its
// own (a skip there changes nothing, the step count included), and the
// counts can differ between shards: a trainer back without its journal
// pushes again a step one shard applied before it died, and its recomputed
// gradient overflows (the shards still missing it skip it). Each part keeps
// its own shard's counts; versions and trainer steps must still agree.
bool SameProgress(const v1::CheckpointProgress& a, const v1::CheckpointProgress& b,
                  const v1::ModelConfig& config) {
  v1::CheckpointProgress x = a, y = b;
  x.clear_shard_last_stats();
  y.clear_shard_last_stats();
  if (StepCountsPerShard(config)) {
    for (v1::CheckpointProgress* p : {&x, &y}) {
      p->clear_optimizer_steps();
      p->clear_skipped_steps();
    }
  }
  x.clear_scheduled();
  y.clear_scheduled();
  if (!google::protobuf::util::MessageDifferencer::Equals(x, y)) return false;
  for (const v1::HyperparameterChange& p : a.scheduled()) {
    for (const v1::HyperparameterChange& q : b.scheduled()) {
      if (p.step() == q.step() && !google::protobuf::util::MessageDifferencer::Equals(p, q)) {
        return false;
      }
    }
  }
  return true;
}

}  // namespace shardopt
