// MakeSpirals: the interleaved-spirals classification problem, plus
// distractor features, generated deterministically from a seed.
//
// Class c's points lie on an arm of a spiral starting at the origin, rotated
// by 2*pi*c/K, with angular jitter: no linear (or shallow) decision boundary
// separates them, so a model only fits them by learning a curved one. The
// extra noise features are standard normal and carry no signal; the model
// must learn to ignore them. Examples are interleaved by class (0, 1, .., K-1,
// 0, ..) so any contiguous slice is roughly class-balanced.
//
// Contract: equal options and seed give a bit-identical Dataset in every
// process running the same binary; that is what lets each trainer generate
// the data locally instead of receiving it.
#ifndef SHARDOPT_TOOLS_TRAIN_SPIRALS_H_
#define SHARDOPT_TOOLS_TRAIN_SPIRALS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "tools/train/dataset.h"

namespace shardopt::train {

struct SpiralsOptions {
  int num_classes = 4;
  int points_per_class = 600;
  int noise_features = 6;
  double turns = 0.75;        // How far each arm winds around the origin.
  double angle_noise = 0.15;  // Radians (standard deviation) of jitter.
};

// INVALID_ARGUMENT for non-positive sizes or negative noise.
absl::StatusOr<Dataset> MakeSpirals(const SpiralsOptions& options, uint64_t seed);

}  // namespace shardopt::train

#endif  // SHARDOPT_TOOLS_TRAIN_SPIRALS_H_
