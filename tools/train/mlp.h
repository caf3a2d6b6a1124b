// Mlp: the architecture of a multilayer-perceptron classifier and how its
// tensors sit in a shardopt flat buffer.
//
// Layer l (1-based) computes y = x * W + b with W = "fc<l>.weight" of shape
// [fan_in, fan_out] (row-major, so a row of W is one input's fan-out, which
// keeps the inner loops contiguous) and b = "fc<l>.bias" [fan_out]. Hidden
// layers apply the activation; the last layer emits one logit per class.
//
// Contract: MlpTensorSpecs is the ModelSpec's tensor list every trainer of a
// job declares; BindMlp resolves those names in a flat buffer once, after
// which the math (mlp_loss.h) runs on raw pointers.
#ifndef SHARDOPT_TOOLS_TRAIN_MLP_H_
#define SHARDOPT_TOOLS_TRAIN_MLP_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/layout.h"
#include "tools/train/tensor_views.h"

namespace shardopt::train {

enum class Activation { kRelu, kTanh };

struct MlpConfig {
  int input_dim = 0;
  std::vector<int> hidden;  // Widths of the hidden layers, input side first.
  int num_classes = 0;
  Activation activation = Activation::kRelu;

  int num_layers() const { return static_cast<int>(hidden.size()) + 1; }
  // Layer l is 0-based here (tensor names are 1-based, as in PyTorch dumps).
  int fan_in(int l) const { return l == 0 ? input_dim : hidden[l - 1]; }
  int fan_out(int l) const { return l + 1 == num_layers() ? num_classes : hidden[l]; }

  // INVALID_ARGUMENT for a non-positive width or fewer than 2 classes.
  absl::Status Validate() const;
};

// "fc1.weight", "fc1.bias", ..., "fc<L>.bias", in that order.
std::vector<TensorSpec> MlpTensorSpecs(const MlpConfig& config);

// Per-layer pointers into a flat buffer. T is const-qualified for read-only
// parameters.
template <typename T>
struct MlpTensors {
  std::vector<T*> weight;
  std::vector<T*> bias;
};

// Resolves every tensor of `config` in `views`; NOT_FOUND or INVALID_ARGUMENT
// when the buffer's layout does not hold this architecture.
template <typename T>
absl::StatusOr<MlpTensors<T>> BindMlp(const MlpConfig& config, const TensorViews<T>& views) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  MlpTensors<T> tensors;
  for (int l = 0; l < config.num_layers(); ++l) {
    const std::string prefix = absl::StrCat("fc", l + 1);
    const uint64_t fan_in = config.fan_in(l), fan_out = config.fan_out(l);
    absl::StatusOr<absl::Span<T>> w = views.Get(prefix + ".weight", fan_in * fan_out);
    if (!w.ok()) return w.status();
    absl::StatusOr<absl::Span<T>> b = views.Get(prefix + ".bias", fan_out);
    if (!b.ok()) return b.status();
    tensors.weight.push_back(w->data());
    tensors.bias.push_back(b->data());
  }
  return tensors;
}

}  // namespace shardopt::train

#endif  // SHARDOPT_TOOLS_TRAIN_MLP_H_
