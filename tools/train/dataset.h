// Dataset: labelled examples held in memory, features row-major.
//
// Contract: features.size() == size() * num_features and every label is in
// [0, num_classes). Plain data: the generators fill it, the model reads it.
#ifndef SHARDOPT_TOOLS_TRAIN_DATASET_H_
#define SHARDOPT_TOOLS_TRAIN_DATASET_H_

#include <vector>

namespace shardopt::train {

struct Dataset {
  int num_features = 0;
  int num_classes = 0;
  std::vector<float> features;
  std::vector<int> labels;

  int size() const { return static_cast<int>(labels.size()); }
  const float* row(int i) const { return features.data() + static_cast<size_t>(i) * num_features; }
};

}  // namespace shardopt::train

#endif  // SHARDOPT_TOOLS_TRAIN_DATASET_H_
