#include "tools/train/spirals.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "tools/train/random.h"

namespace shardopt::train {

absl::StatusOr<Dataset> MakeSpirals(const SpiralsOptions& options, uint64_t seed) {
  if (options.num_classes < 2 || options.points_per_class < 1 || options.noise_features < 0 ||
      options.turns <= 0 || options.angle_noise < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bad spirals options: classes=", options.num_classes,
        " points_per_class=", options.points_per_class, " noise_features=", options.noise_features,
        " turns=", options.turns, " angle_noise=", options.angle_noise));
  }
  constexpr double kTwoPi = 6.283185307179586;
  Dataset data;
  data.num_classes = options.num_classes;
  data.num_features = 2 + options.noise_features;
  const int n = options.num_classes * options.points_per_class;
  data.features.reserve(static_cast<size_t>(n) * data.num_features);
  data.labels.reserve(n);
  SplitMix64 rng(seed);
  for (int i = 0; i < options.points_per_class; ++i) {
    // Skip r = 0, where all arms meet and the label is pure chance.
    const double t = (i + 1.0) / options.points_per_class;
    for (int c = 0; c < options.num_classes; ++c) {
      const double angle = kTwoPi * c / options.num_classes + kTwoPi * options.turns * t +
                           options.angle_noise * rng.Normal();
      // Scale the radius so the two signal features have unit-ish spread,
      // like the noise features: no feature dominates at initialisation.
      const double radius = 1.5 * t;
      data.features.push_back(static_cast<float>(radius * std::cos(angle)));
      data.features.push_back(static_cast<float>(radius * std::sin(angle)));
      for (int f = 0; f < options.noise_features; ++f) {
        data.features.push_back(static_cast<float>(rng.Normal()));
      }
      data.labels.push_back(c);
    }
  }
  return data;
}

}  // namespace shardopt::train
