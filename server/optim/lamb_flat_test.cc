// LAMB on the flat partition: tensors cut anywhere (on 64-element blocks)
// over S shards, each shard measuring its pieces' trust partials, the
// partials combined into every tensor's norms (CombineTrustPartials) and
// each shard updating with them, gives exactly the bits of one shard
// updating whole tensors - with and without a gradient multiplier (clipping),
// for S in {1, 2, 3, 5}, and whatever the split of a piece into parts.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/consistency.h"
#include "common/layout.h"
#include "common/optimizer_config.h"
#include "common/step_protocol.h"
#include "gtest/gtest.h"
#include "server/optim/optimizer.h"

namespace shardopt {
namespace {

std::vector<TensorSpec> Specs() {
  // Larger than a shard, odd sizes, a scalar: pieces start and end anywhere
  // on the 64-element grid.
  const std::vector<std::vector<int64_t>> shapes = {{300, 7}, {37, 11}, {1000}, {5}, {}, {3, 4, 5}};
  std::vector<TensorSpec> specs;
  for (size_t i = 0; i < shapes.size(); ++i) {
    specs.push_back(TensorSpec{"t" + std::to_string(i), shapes[i], DType::kFloat32});
  }
  return specs;
}

float InitialValue(size_t tensor, uint64_t k) { return 0.01f * (tensor + 1) * (k % 17) - 0.05f; }
float Gradient(int64_t step, size_t tensor, uint64_t k) {
  return static_cast<float>(std::sin(0.37 * step + 0.11 * k + tensor));
}
// Clipping on some steps: the multiplier the shards apply in place.
float Multiplier(int64_t step) { return step % 3 == 0 ? 0.37f : 1.0f; }

std::vector<float> InitialBuffer(const ModelLayout& layout) {
  std::vector<float> params(layout.total_elements(), 0.0f);
  for (size_t ti = 0; ti < layout.tensors().size(); ++ti) {
    const TensorPlacement& t = layout.tensors()[ti];
    for (uint64_t k = 0; k < t.size; ++k) params[t.offset + k] = InitialValue(ti, k);
  }
  return params;
}

void FillGradient(const ModelLayout& layout, int64_t step, std::vector<float>* grad) {
  for (size_t ti = 0; ti < layout.tensors().size(); ++ti) {
    const TensorPlacement& t = layout.tensors()[ti];
    for (uint64_t k = 0; k < t.size; ++k) (*grad)[t.offset + k] = Gradient(step, ti, k);
  }
}

std::vector<std::vector<float>> ByTensor(const ModelLayout& layout, const std::vector<float>& p) {
  std::vector<std::vector<float>> out;
  for (const TensorPlacement& t : layout.tensors()) {
    out.emplace_back(p.begin() + t.offset, p.begin() + t.offset + t.size);
  }
  return out;
}

// One shard holding every tensor whole, updating with its own norms.
std::vector<std::vector<float>> TrainWhole(const OptimizerConfig& config, int steps) {
  const ModelLayout layout = ModelLayout::Create(Specs(), 16, 1, Partition::kWholeTensors).value();
  std::vector<float> params = InitialBuffer(layout), grad(layout.total_elements(), 0.0f);
  std::unique_ptr<Optimizer> opt =
      Optimizer::Create(config, layout.total_elements(), WholeTensorsOfShard(layout, 0).value())
          .value();
  for (int64_t step = 1; step <= steps; ++step) {
    FillGradient(layout, step, &grad);
    for (float& g : grad) g *= Multiplier(step);
    opt->Update(step, params.data(), grad.data(), 0, params.size());
  }
  return ByTensor(layout, params);
}

// S shards of a flat layout, each measuring its pieces in parts of
// `part_elements`, the partials combined as a trainer does.
std::vector<std::vector<float>> TrainFlat(const OptimizerConfig& config, uint32_t shards,
                                          uint64_t part_elements, int steps) {
  const ModelLayout layout = ModelLayout::Create(Specs(), 64, shards).value();
  std::vector<float> params = InitialBuffer(layout), grad(layout.total_elements(), 0.0f);
  std::vector<std::unique_ptr<Optimizer>> opts;
  for (uint32_t s = 0; s < shards; ++s) {
    opts.push_back(
        Optimizer::Create(config, layout.ShardSize(s), TensorPiecesOfShard(layout, s)).value());
  }
  for (int64_t step = 1; step <= steps; ++step) {
    FillGradient(layout, step, &grad);
    const float multiplier = Multiplier(step);
    std::vector<StepStats> stats(shards);
    for (uint32_t s = 0; s < shards; ++s) {
      const FlatRange range = layout.ShardRange(s);
      const std::vector<RangeTensor>& pieces = opts[s]->tensors();
      for (size_t i = 0; i < pieces.size(); ++i) {
        TrustPartial partial;
        partial.tensor_index = pieces[i].index;
        partial.whole_tensor = pieces[i].whole;
        const uint64_t end = pieces[i].offset + pieces[i].size;
        for (uint64_t b = pieces[i].offset; b < end; b += part_elements) {
          TrustPartial part;
          opts[s]->MeasureTrust(step, params.data() + range.begin, grad.data() + range.begin,
                                multiplier, i, b, std::min(end, b + part_elements), &part);
          partial.weight_squares.Add(part.weight_squares);
          partial.update_squares.Add(part.update_squares);
        }
        stats[s].trust_partials.push_back(partial);
      }
    }
    absl::StatusOr<std::vector<TensorNorms>> norms = CombineTrustPartials(stats, layout);
    EXPECT_TRUE(norms.ok()) << norms.status();
    if (!norms.ok()) return {};
    for (float& g : grad) g *= multiplier;
    for (uint32_t s = 0; s < shards; ++s) {
      EXPECT_TRUE(CheckTensorNorms(*norms, layout.tensors().size(), stats[s].trust_partials).ok());
      const FlatRange range = layout.ShardRange(s);
      const std::vector<RangeTensor>& pieces = opts[s]->tensors();
      for (size_t i = 0; i < pieces.size(); ++i) {
        const uint64_t end = pieces[i].offset + pieces[i].size;
        for (uint64_t b = pieces[i].offset; b < end; b += part_elements) {
          opts[s]->UpdateWithTrust(step, params.data() + range.begin, grad.data() + range.begin, i,
                                   b, std::min(end, b + part_elements), (*norms)[pieces[i].index]);
        }
      }
    }
  }
  return ByTensor(layout, params);
}

std::vector<OptimizerConfig> Configs() {
  OptimizerConfig apex = OptimizerConfig::Lamb(2e-3);
  apex.bias_correction = false;
  apex.max_trust_ratio = 0;
  apex.min_trust_ratio = 0;
  apex.maximize = true;
  apex.weight_decay = 0.1;
  OptimizerConfig clamped = OptimizerConfig::Lamb(1e-3);
  clamped.min_trust_ratio = 0.5;
  clamped.max_trust_ratio = 0.8;
  return {OptimizerConfig::Lamb(1e-3), apex, clamped};
}

TEST(LambFlatTest, PiecesOverAnyShardCountGiveTheBitsOfWholeTensors) {
  for (const OptimizerConfig& config : Configs()) {
    SCOPED_TRACE(config.DebugString());
    const auto reference = TrainWhole(config, 30);
    for (uint32_t shards : {1u, 2u, 3u, 5u}) {
      for (uint64_t part : {uint64_t{64}, uint64_t{192}, uint64_t{1} << 20}) {
        EXPECT_EQ(TrainFlat(config, shards, part, 30), reference)
            << shards << " shards, parts of " << part;
      }
    }
  }
}

TEST(LambFlatTest, SomeTensorIsCutWhenThereAreSeveralShards) {
  // (Else the test above would compare whole tensors only.)
  const ModelLayout layout = ModelLayout::Create(Specs(), 64, 3).value();
  bool cut = false;
  for (uint32_t s = 0; s < 3; ++s) {
    for (const RangeTensor& piece : TensorPiecesOfShard(layout, s)) cut = cut || !piece.whole;
  }
  EXPECT_TRUE(cut);
  EXPECT_TRUE(StepsNeedTrustNorms(OptimizerKind::kLamb, layout));
  EXPECT_FALSE(StepsNeedTrustNorms(OptimizerKind::kAdamW, layout));
  EXPECT_FALSE(
      StepsNeedTrustNorms(OptimizerKind::kLamb, ModelLayout::Create(Specs(), 64, 1).value()));
}

TEST(LambFlatTest, MeasuringChangesNothing) {
  const ModelLayout layout = ModelLayout::Create(Specs(), 64, 2).value();
  const FlatRange range = layout.ShardRange(1);
  std::unique_ptr<Optimizer> opt =
      Optimizer::Create(OptimizerConfig::Lamb(1e-3), range.size(), TensorPiecesOfShard(layout, 1))
          .value();
  std::vector<float> params = InitialBuffer(layout), grad(layout.total_elements(), 0.0f);
  FillGradient(layout, 1, &grad);
  const std::vector<float> params_before = params;
  TrustPartial first, second;
  const RangeTensor& piece = opt->tensors()[0];
  opt->MeasureTrust(1, params.data() + range.begin, grad.data() + range.begin, 0.5f, 0,
                    piece.offset, piece.offset + piece.size, &first);
  opt->MeasureTrust(1, params.data() + range.begin, grad.data() + range.begin, 0.5f, 0,
                    piece.offset, piece.offset + piece.size, &second);
  EXPECT_EQ(first.weight_squares, second.weight_squares);
  EXPECT_EQ(first.update_squares, second.update_squares);
  EXPECT_FALSE(first.update_squares.IsZero());
  EXPECT_EQ(params, params_before);
  for (size_t slot = 0; slot < opt->slot_names().size(); ++slot) {
    for (float x : opt->SlotValues(slot)) ASSERT_EQ(x, 0.0f);
  }
}

TEST(LambFlatTest, WhatCannotWorkIsRefused) {
  // Pieces whose first element is not on the 64-element grid of its tensor.
  const ModelLayout fine = ModelLayout::Create(Specs(), 16, 5).value();
  bool refused = false;
  for (uint32_t s = 0; s < 5; ++s) {
    const std::vector<RangeTensor> pieces = TensorPiecesOfShard(fine, s);
    bool off_grid = false;
    for (const RangeTensor& p : pieces) off_grid = off_grid || p.start % kTrustBlockElements != 0;
    absl::StatusOr<std::unique_ptr<Optimizer>> made =
        Optimizer::Create(OptimizerConfig::Lamb(), fine.ShardSize(s), pieces);
    EXPECT_EQ(made.ok(), !off_grid);
    refused = refused || off_grid;
    // The other whole-tensor optimizers take no pieces at all.
    bool cut = false;
    for (const RangeTensor& p : pieces) cut = cut || !p.whole;
    if (cut) {
      EXPECT_EQ(Optimizer::Create(OptimizerConfig::Adafactor(), fine.ShardSize(s), pieces)
                    .status()
                    .code(),
                absl::StatusCode::kInvalidArgument);
    }
  }
  EXPECT_TRUE(refused);
  // The model-level rules: sync only, alignment on the grid.
  const ModelLayout flat = ModelLayout::Create(Specs(), 64, 2).value();
  EXPECT_TRUE(CheckTrustNormsFit(OptimizerKind::kLamb, flat, Consistency::kSync).ok());
  EXPECT_EQ(CheckTrustNormsFit(OptimizerKind::kLamb, flat, Consistency::kAsync).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckTrustNormsFit(OptimizerKind::kLamb, fine, Consistency::kSync).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckTrustNormsFit(OptimizerKind::kAdamW, fine, Consistency::kAsync).ok());
  EXPECT_TRUE(CheckOptimizerFitsPartition(OptimizerKind::kLamb, false).ok());
}

}  // namespace
}  // namespace shardopt
