#include "tools/train/mlp_loss.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace shardopt::train {
namespace {

// Row-major [n, width] activations of every layer: acts[0] is the input
// batch, acts[l] the output of layer l, acts[L] the logits. The backward
// pass needs the post-activation values only: ReLU' and tanh' are both
// functions of the layer's output.
template <typename T>
struct Activations {
  int n = 0;
  std::vector<std::vector<T>> acts;
};

template <typename T>
Activations<T> Forward(const MlpConfig& config, const MlpTensors<const T>& params,
                       const Dataset& data, absl::Span<const int> indices) {
  Activations<T> a;
  a.n = static_cast<int>(indices.size());
  a.acts.resize(config.num_layers() + 1);
  std::vector<T>& input = a.acts[0];
  input.resize(static_cast<size_t>(a.n) * config.input_dim);
  for (int i = 0; i < a.n; ++i) {
    const float* row = data.row(indices[i]);
    std::copy(row, row + config.input_dim,
              input.begin() + static_cast<size_t>(i) * config.input_dim);
  }
  for (int l = 0; l < config.num_layers(); ++l) {
    const int in = config.fan_in(l), out = config.fan_out(l);
    const T* w = params.weight[l];
    const T* b = params.bias[l];
    const std::vector<T>& x = a.acts[l];
    std::vector<T>& y = a.acts[l + 1];
    y.resize(static_cast<size_t>(a.n) * out);
    const bool hidden = l + 1 < config.num_layers();
    for (int i = 0; i < a.n; ++i) {
      T* yi = y.data() + static_cast<size_t>(i) * out;
      std::copy(b, b + out, yi);
      const T* xi = x.data() + static_cast<size_t>(i) * in;
      for (int k = 0; k < in; ++k) {
        const T xk = xi[k];
        const T* wk = w + static_cast<size_t>(k) * out;
        for (int j = 0; j < out; ++j) yi[j] += xk * wk[j];
      }
      if (!hidden) continue;
      if (config.activation == Activation::kRelu) {
        for (int j = 0; j < out; ++j) yi[j] = std::max(yi[j], T(0));
      } else {
        for (int j = 0; j < out; ++j) yi[j] = std::tanh(yi[j]);
      }
    }
  }
  return a;
}

// Turns the logits of row `i` into softmax probabilities in place and returns
// that example's cross-entropy. Subtracting the max keeps exp() in range;
// taking the loss from the shifted logit, not log(probability), keeps it
// finite when the label's probability underflows.
template <typename T>
double SoftmaxCrossEntropy(T* logits, int classes, int label) {
  const T max = *std::max_element(logits, logits + classes);
  const double shifted_label_logit = static_cast<double>(logits[label] - max);
  T sum = 0;
  for (int j = 0; j < classes; ++j) {
    logits[j] = std::exp(logits[j] - max);
    sum += logits[j];
  }
  for (int j = 0; j < classes; ++j) logits[j] /= sum;
  return std::log(static_cast<double>(sum)) - shifted_label_logit;
}

}  // namespace

template <typename T>
double MlpLossAndGradient(const MlpConfig& config, const MlpTensors<const T>& params,
                          const Dataset& data, absl::Span<const int> indices,
                          const MlpTensors<T>* grads) {
  Activations<T> a = Forward(config, params, data, indices);
  const int n = a.n;
  const int classes = config.num_classes;
  const int L = config.num_layers();

  // delta = d(mean loss)/d(logits) = (softmax - onehot) / n.
  std::vector<T> delta = std::move(a.acts[L]);
  double loss_sum = 0;
  for (int i = 0; i < n; ++i) {
    T* p = delta.data() + static_cast<size_t>(i) * classes;
    const int label = data.labels[indices[i]];
    loss_sum += SoftmaxCrossEntropy(p, classes, label);
    p[label] -= T(1);
    for (int j = 0; j < classes; ++j) p[j] /= static_cast<T>(n);
  }
  if (grads == nullptr) return loss_sum / n;

  for (int l = L - 1; l >= 0; --l) {
    const int in = config.fan_in(l), out = config.fan_out(l);
    const std::vector<T>& x = a.acts[l];
    T* dw = grads->weight[l];
    T* db = grads->bias[l];
    std::fill(dw, dw + static_cast<size_t>(in) * out, T(0));
    std::fill(db, db + out, T(0));
    for (int i = 0; i < n; ++i) {
      const T* di = delta.data() + static_cast<size_t>(i) * out;
      const T* xi = x.data() + static_cast<size_t>(i) * in;
      for (int j = 0; j < out; ++j) db[j] += di[j];
      for (int k = 0; k < in; ++k) {
        const T xk = xi[k];
        T* dwk = dw + static_cast<size_t>(k) * out;
        for (int j = 0; j < out; ++j) dwk[j] += xk * di[j];
      }
    }
    if (l == 0) break;  // Nobody needs d(loss)/d(input).

    // delta_prev = (delta * W^T) (.) act'(x), where x is this layer's input,
    // i.e. the previous layer's post-activation output.
    const T* w = params.weight[l];
    std::vector<T> prev(static_cast<size_t>(n) * in);
    for (int i = 0; i < n; ++i) {
      const T* di = delta.data() + static_cast<size_t>(i) * out;
      const T* xi = x.data() + static_cast<size_t>(i) * in;
      T* pi = prev.data() + static_cast<size_t>(i) * in;
      for (int k = 0; k < in; ++k) {
        const T* wk = w + static_cast<size_t>(k) * out;
        T dot = 0;
        for (int j = 0; j < out; ++j) dot += di[j] * wk[j];
        pi[k] = config.activation == Activation::kRelu ? (xi[k] > T(0) ? dot : T(0))
                                                       : dot * (T(1) - xi[k] * xi[k]);
      }
    }
    delta = std::move(prev);
  }
  return loss_sum / n;
}

template <typename T>
MlpMetrics EvaluateMlp(const MlpConfig& config, const MlpTensors<const T>& params,
                       const Dataset& data) {
  std::vector<int> all(data.size());
  std::iota(all.begin(), all.end(), 0);
  Activations<T> a = Forward(config, params, data, absl::MakeConstSpan(all));
  const int classes = config.num_classes;
  double loss_sum = 0;
  int correct = 0;
  for (int i = 0; i < a.n; ++i) {
    T* logits = a.acts.back().data() + static_cast<size_t>(i) * classes;
    const int predicted = static_cast<int>(std::max_element(logits, logits + classes) - logits);
    if (predicted == data.labels[i]) ++correct;
    loss_sum += SoftmaxCrossEntropy(logits, classes, data.labels[i]);
  }
  MlpMetrics metrics;
  if (a.n > 0) {
    metrics.loss = loss_sum / a.n;
    metrics.accuracy = static_cast<double>(correct) / a.n;
  }
  return metrics;
}

template double MlpLossAndGradient<float>(const MlpConfig&, const MlpTensors<const float>&,
                                          const Dataset&, absl::Span<const int>,
                                          const MlpTensors<float>*);
template double MlpLossAndGradient<double>(const MlpConfig&, const MlpTensors<const double>&,
                                           const Dataset&, absl::Span<const int>,
                                           const MlpTensors<double>*);
template MlpMetrics EvaluateMlp<float>(const MlpConfig&, const MlpTensors<const float>&,
                                       const Dataset&);
template MlpMetrics EvaluateMlp<double>(const MlpConfig&, const MlpTensors<const double>&,
                                        const Dataset&);

}  // namespace shardopt::train
