// TensorViews: tensor name -> span over one flat buffer laid out by a
// ModelLayout, so model code asks for "fc1.weight" instead of doing offset
// arithmetic that must match the servers' layout by hand.
//
// Contract: a TensorViews borrows the buffer (which must outlive it) and
// copies the layout. T is float for gradients, const float for parameters
// only read, double for reference computations in tests: the layout counts
// elements, so the same offsets hold for any element type. Padding between
// tensors is never exposed.
#ifndef SHARDOPT_TOOLS_TRAIN_TENSOR_VIEWS_H_
#define SHARDOPT_TOOLS_TRAIN_TENSOR_VIEWS_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/layout.h"

namespace shardopt::train {

template <typename T>
class TensorViews {
 public:
  // INVALID_ARGUMENT unless `flat` has exactly layout.total_elements() elements.
  static absl::StatusOr<TensorViews> Create(const ModelLayout& layout, absl::Span<T> flat) {
    if (flat.size() != layout.total_elements()) {
      return absl::InvalidArgumentError(absl::StrCat("flat buffer has ", flat.size(),
                                                     " elements; the layout needs ",
                                                     layout.total_elements()));
    }
    return TensorViews(layout, flat);
  }

  // NOT_FOUND for an unknown name.
  absl::StatusOr<absl::Span<T>> Get(absl::string_view name) const {
    absl::StatusOr<size_t> index = layout_.Find(name);
    if (!index.ok()) return index.status();
    const TensorPlacement& p = layout_.tensors()[*index];
    return flat_.subspan(p.offset, p.size);
  }

  // As Get, and INVALID_ARGUMENT when the tensor does not have
  // `expected_size` elements (catches a model/spec mismatch early).
  absl::StatusOr<absl::Span<T>> Get(absl::string_view name, uint64_t expected_size) const {
    absl::StatusOr<absl::Span<T>> view = Get(name);
    if (view.ok() && view->size() != expected_size) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has ", view->size(),
                                                     " elements; expected ", expected_size));
    }
    return view;
  }

  const ModelLayout& layout() const { return layout_; }

 private:
  TensorViews(const ModelLayout& layout, absl::Span<T> flat) : layout_(layout), flat_(flat) {}

  ModelLayout layout_;
  absl::Span<T> flat_;
};

}  // namespace shardopt::train

#endif  // SHARDOPT_TOOLS_TRAIN_TENSOR_VIEWS_H_
