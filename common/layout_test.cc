#include "common/layout.h"

#include <algorithm>
#include <random>
#include <vector>

#include "common/proto_convert.h"
#include "gtest/gtest.h"

namespace shardopt {
namespace {

std::vector<TensorSpec> RandomTensors(std::mt19937_64& rng, int count) {
  std::vector<TensorSpec> specs;
  std::uniform_int_distribution<int> rank_dist(0, 3);
  std::uniform_int_distribution<int> dim_dist(0, 37);
  for (int i = 0; i < count; ++i) {
    TensorSpec spec;
    spec.name = "t" + std::to_string(i);
    const int rank = rank_dist(rng);
    for (int d = 0; d < rank; ++d) spec.shape.push_back(dim_dist(rng));
    specs.push_back(spec);
  }
  return specs;
}

// Every element owned by exactly one shard, ranges equal and aligned, tensors
// placed without overlap, and tensors reassembled exactly from shard pieces.
TEST(ModelLayoutTest, PartitionPropertiesOnRandomModels) {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const uint32_t shards = 1 + trial % 7;
    const uint32_t alignment = 1u << (trial % 8);
    absl::StatusOr<ModelLayout> layout =
        ModelLayout::Create(RandomTensors(rng, 1 + trial % 9), alignment, shards);
    ASSERT_TRUE(layout.ok()) << layout.status();
    const uint64_t total = layout->total_elements();
    ASSERT_EQ(total % (uint64_t{alignment} * shards), 0u);

    std::vector<int> owners(total, 0);
    for (uint32_t s = 0; s < shards; ++s) {
      const FlatRange r = layout->ShardRange(s);
      EXPECT_EQ(r.size(), layout->ShardSize(0));
      EXPECT_EQ(r.begin % alignment, 0u);
      for (uint64_t i = r.begin; i < r.end; ++i) owners[i]++;
    }
    for (uint64_t i = 0; i < total; ++i) ASSERT_EQ(owners[i], 1) << "element " << i;

    // Tensors: aligned, disjoint, inside the buffer.
    std::vector<int> used(total, 0);
    uint64_t used_count = 0;
    for (const TensorPlacement& t : layout->tensors()) {
      EXPECT_EQ(t.offset % alignment, 0u);
      EXPECT_EQ(t.size, t.spec.num_elements());
      ASSERT_LE(t.offset + t.size, total);
      for (uint64_t i = t.offset; i < t.offset + t.size; ++i) used[i]++;
      used_count += t.size;
    }
    for (uint64_t i = 0; i < total; ++i) ASSERT_LE(used[i], 1);
    EXPECT_EQ(used_count, layout->used_elements());

    // Reassemble: write each tensor's element index through the shard pieces,
    // then read every tensor back through its placement.
    std::vector<int64_t> flat(total, -1);
    for (uint32_t s = 0; s < shards; ++s) {
      for (const TensorPiece& p : layout->PiecesIn(layout->ShardRange(s))) {
        for (uint64_t k = 0; k < p.size; ++k) {
          ASSERT_EQ(flat[p.flat_offset + k], -1) << "element written twice";
          flat[p.flat_offset + k] =
              static_cast<int64_t>(p.tensor_index * 100000 + p.tensor_offset + k);
        }
      }
    }
    for (size_t ti = 0; ti < layout->tensors().size(); ++ti) {
      const TensorPlacement& t = layout->tensors()[ti];
      for (uint64_t k = 0; k < t.size; ++k) {
        ASSERT_EQ(flat[t.offset + k], static_cast<int64_t>(ti * 100000 + k));
      }
    }
  }
}

// Whole tensors: every tensor inside exactly one shard's range, ranges
// contiguous and aligned covering the buffer, every piece whole, the
// documented bound on the largest shard, and the tensors the same as flat.
TEST(ModelLayoutTest, WholeTensorPartitionPropertiesOnRandomModels) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const uint32_t shards = 1 + trial % 7;
    const uint32_t alignment = 1u << (trial % 8);
    const std::vector<TensorSpec> specs = RandomTensors(rng, 1 + trial % 12);
    absl::StatusOr<ModelLayout> layout =
        ModelLayout::Create(specs, alignment, shards, Partition::kWholeTensors);
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_EQ(layout->partition(), Partition::kWholeTensors);
    const ModelLayout flat = ModelLayout::Create(specs, alignment, shards).value();
    EXPECT_TRUE(layout->SameTensors(flat));
    EXPECT_EQ(layout->used_elements(), flat.used_elements());

    uint64_t at = 0, aligned_sum = 0, largest = 0;
    for (uint32_t s = 0; s < shards; ++s) {
      const FlatRange r = layout->ShardRange(s);
      EXPECT_EQ(r.begin, at);
      EXPECT_EQ(r.begin % alignment, 0u);
      EXPECT_GT(r.size(), 0u);
      at = r.end;
    }
    EXPECT_EQ(at, layout->total_elements());
    for (size_t ti = 0; ti < layout->tensors().size(); ++ti) {
      const TensorPlacement& t = layout->tensors()[ti];
      EXPECT_EQ(t.offset % alignment, 0u);
      const uint32_t s = layout->ShardOfTensor(ti);
      const FlatRange r = layout->ShardRange(s);
      EXPECT_GE(t.offset, r.begin);
      EXPECT_LE(t.offset + t.size, r.end) << "tensor " << ti << " straddles shard " << s;
      const uint64_t aligned = (t.size + alignment - 1) / alignment * alignment;
      aligned_sum += aligned;
      largest = std::max(largest, aligned);
    }
    for (uint32_t s = 0; s < shards; ++s) {
      EXPECT_LE(layout->ShardSize(s), (aligned_sum + shards - 1) / shards + largest + alignment);
      for (const TensorPiece& p : layout->PiecesIn(layout->ShardRange(s))) {
        EXPECT_EQ(p.tensor_offset, 0u);
        EXPECT_EQ(p.size, layout->tensors()[p.tensor_index].size);
      }
    }
    // Tensors disjoint.
    std::vector<int> used(layout->total_elements(), 0);
    for (const TensorPlacement& t : layout->tensors()) {
      for (uint64_t i = t.offset; i < t.offset + t.size; ++i) ASSERT_EQ(++used[i], 1);
    }
  }
}

TEST(ModelLayoutTest, WholeTensorsKnownAssignment) {
  // Largest first to the emptiest shard: "a" (100 -> 104) to 0, "c" (60 ->
  // 64) to 1, "b" (40) to 1 (64 < 104), "d" (1 -> 8) to 0 (both hold 104: the lowest
  // index).
  absl::StatusOr<ModelLayout> layout = ModelLayout::Create(
      {{"a", {10, 10}}, {"b", {40}}, {"c", {6, 10}}, {"d", {}}}, 8, 2, Partition::kWholeTensors);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->ShardOfTensor(0), 0u);
  EXPECT_EQ(layout->ShardOfTensor(1), 1u);
  EXPECT_EQ(layout->ShardOfTensor(2), 1u);
  EXPECT_EQ(layout->ShardOfTensor(3), 0u);
  // Shard 0: a at 0, d at 104; shard 1 from 112: b at 112, c at 152.
  EXPECT_EQ(layout->tensors()[0].offset, 0u);
  EXPECT_EQ(layout->tensors()[3].offset, 104u);
  EXPECT_EQ(layout->ShardRange(0).end, 112u);
  EXPECT_EQ(layout->tensors()[1].offset, 112u);
  EXPECT_EQ(layout->tensors()[2].offset, 152u);
  EXPECT_EQ(layout->total_elements(), 216u);
  EXPECT_EQ(layout->DescribeElement(153), "tensor 'c'[1]");
  EXPECT_EQ(layout->DescribeElement(105), "padding element 105");
  EXPECT_NEAR(layout->Imbalance(), 112.0 * 2 / 216, 1e-12);
  EXPECT_FALSE(layout->LargestTensorOutweighsRest());
  // A proto round trip keeps the partition and the offsets.
  absl::StatusOr<ModelLayout> back = LayoutFromProto(LayoutToProto(*layout), 2);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->partition(), Partition::kWholeTensors);
  EXPECT_EQ(back->tensors()[2].offset, 152u);
}

// An empty tensor last on one shard sits at the next shard's first offset:
// the next shard's tensor is still found (the pieces' search needs the
// empty one first), and the empty one is on its own shard.
TEST(ModelLayoutTest, WholeTensorsWithAnEmptyTensorAtAShardBoundary) {
  absl::StatusOr<ModelLayout> layout =
      ModelLayout::Create({{"a", {100}}, {"b", {100}}, {"c", {100}}, {"d", {100}}, {"e", {0}}}, 64,
                          3, Partition::kWholeTensors);
  ASSERT_TRUE(layout.ok());
  for (uint32_t s = 0; s < 3; ++s) {
    uint64_t elements = 0;
    for (const TensorPiece& p : layout->PiecesIn(layout->ShardRange(s))) elements += p.size;
    uint64_t expected = 0;
    for (size_t t = 0; t < layout->tensors().size(); ++t) {
      if (layout->ShardOfTensor(t) == s) expected += layout->tensors()[t].size;
    }
    EXPECT_EQ(elements, expected) << "shard " << s;
    EXPECT_GT(elements, 0u) << "shard " << s;
  }
  const TensorPlacement& empty = layout->tensors()[4];
  const uint32_t shard = layout->ShardOfTensor(4);
  EXPECT_GE(empty.offset, layout->ShardRange(shard).begin);
  EXPECT_LE(empty.offset, layout->ShardRange(shard).end);
}

TEST(ModelLayoutTest, WholeTensorsWithOneHugeTensorAndMoreShardsThanTensors) {
  absl::StatusOr<ModelLayout> layout =
      ModelLayout::Create({{"huge", {1000}}, {"small", {10}}}, 4, 4, Partition::kWholeTensors);
  ASSERT_TRUE(layout.ok());
  EXPECT_TRUE(layout->LargestTensorOutweighsRest());
  EXPECT_EQ(layout->DescribeImbalance(),
            "tensor 'huge' (1000 elements) outweighs all others together (10): shard 0 holds it, "
            "the largest shard 3.92x the mean (the flat partition splits it evenly, for the "
            "optimizers that allow it)");
  EXPECT_EQ(ModelLayout::Create({{"huge", {1000}}, {"small", {10}}}, 4, 4)->DescribeImbalance(),
            "");  // (Flat: every shard holds an even part.)
  EXPECT_EQ(layout->ShardSize(0), 1000u);
  EXPECT_EQ(layout->ShardSize(1), 12u);
  EXPECT_EQ(layout->ShardSize(2), 4u);  // No tensor: one aligned block.
  EXPECT_EQ(layout->ShardSize(3), 4u);
  EXPECT_TRUE(layout->PiecesIn(layout->ShardRange(3)).empty());
  EXPECT_EQ(PartitionFromName("whole_tensors").value(), Partition::kWholeTensors);
  EXPECT_EQ(PartitionFromName("flat").value(), Partition::kFlat);
  EXPECT_EQ(PartitionFromName("rows").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelLayoutTest, KnownPlacement) {
  absl::StatusOr<ModelLayout> layout = ModelLayout::Create(
      {{"w", {3, 5}, DType::kFloat32}, {"b", {5}, DType::kFloat32}, {"s", {}, DType::kFloat32}},
      /*alignment=*/8, /*shard_count=*/3);
  ASSERT_TRUE(layout.ok());
  ASSERT_EQ(layout->tensors().size(), 3u);
  EXPECT_EQ(layout->tensors()[0].offset, 0u);
  EXPECT_EQ(layout->tensors()[1].offset, 16u);  // 15 rounded up to 8.
  EXPECT_EQ(layout->tensors()[2].offset, 24u);
  EXPECT_EQ(layout->tensors()[2].size, 1u);  // A scalar.
  EXPECT_EQ(layout->total_elements(), 48u);  // 25 rounded up to 3 * 8.
  EXPECT_EQ(layout->used_elements(), 21u);
  EXPECT_EQ(layout->ShardRange(1).begin, 16u);
  EXPECT_EQ(layout->ShardRange(2).end, 48u);
  // Shard 0 [0,16) holds w[0..15); shard 1 [16,32) holds b and s.
  std::vector<TensorPiece> pieces = layout->PiecesIn(layout->ShardRange(1));
  ASSERT_EQ(pieces.size(), 2u);
  EXPECT_EQ(pieces[0].tensor_index, 1u);
  EXPECT_EQ(pieces[1].tensor_index, 2u);
  EXPECT_TRUE(layout->PiecesIn(layout->ShardRange(2)).empty());
  EXPECT_EQ(*layout->Find("b"), 1u);
  EXPECT_EQ(layout->DescribeElement(7), "tensor 'w'[7]");
  EXPECT_EQ(layout->DescribeElement(18), "tensor 'b'[2]");
  EXPECT_EQ(layout->DescribeElement(15), "padding element 15");
  EXPECT_EQ(layout->DescribeElement(40), "padding element 40");
  EXPECT_EQ(layout->Find("nope").status().code(), absl::StatusCode::kNotFound);
}

TEST(ModelLayoutTest, StraddlingTensorSplitsAcrossShards) {
  absl::StatusOr<ModelLayout> layout = ModelLayout::Create({{"big", {100}, DType::kFloat32}}, 4, 4);
  ASSERT_TRUE(layout.ok());
  uint64_t covered = 0;
  for (uint32_t s = 0; s < 4; ++s) {
    for (const TensorPiece& p : layout->PiecesIn(layout->ShardRange(s))) {
      EXPECT_EQ(p.tensor_offset, covered);
      covered += p.size;
    }
  }
  EXPECT_EQ(covered, 100u);
}

TEST(ModelLayoutTest, RejectsInvalidLayouts) {
  EXPECT_EQ(ModelLayout::Create({{"a", {2}}, {"a", {3}}}, 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ModelLayout::Create({{"", {2}}}, 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ModelLayout::Create({{"a", {2, -1}}}, 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ModelLayout::Create({{"a", {2}}}, 3, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ModelLayout::Create({{"a", {2}}}, 0, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ModelLayout::Create({{"a", {1 << 30, 1 << 30}}}, 0, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ModelLayoutTest, EmptyModelStillGivesEveryShardARange) {
  absl::StatusOr<ModelLayout> layout = ModelLayout::Create({}, 16, 3);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->ShardSize(0), 16u);
}

TEST(ModelLayoutTest, ProtoRoundTripGivesTheSameLayout) {
  absl::StatusOr<ModelLayout> layout =
      ModelLayout::Create({{"w", {4, 7}, DType::kBFloat16}, {"b", {7}, DType::kFloat32}}, 32, 2);
  ASSERT_TRUE(layout.ok());
  absl::StatusOr<ModelLayout> back = LayoutFromProto(LayoutToProto(*layout), 2);
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(back->tensors().size(), 2u);
  EXPECT_EQ(back->tensors()[0].spec.dtype, DType::kBFloat16);
  EXPECT_EQ(back->tensors()[1].offset, layout->tensors()[1].offset);
  EXPECT_EQ(back->total_elements(), layout->total_elements());
}

TEST(OptimizerConfigProtoTest, RoundTripAndValidation) {
  OptimizerConfig sgd = OptimizerConfig::Sgd(0.1);
  sgd.momentum = 0.9;
  sgd.nesterov = true;
  absl::StatusOr<OptimizerConfig> back = OptimizerConfigFromProto(OptimizerConfigToProto(sgd));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->kind, OptimizerKind::kSgd);
  EXPECT_TRUE(back->nesterov);
  EXPECT_DOUBLE_EQ(back->momentum, 0.9);

  OptimizerConfig adamw = OptimizerConfig::AdamW(3e-4);
  adamw.amsgrad = true;
  back = OptimizerConfigFromProto(OptimizerConfigToProto(adamw));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->kind, OptimizerKind::kAdamW);
  EXPECT_TRUE(back->amsgrad);
  EXPECT_DOUBLE_EQ(back->weight_decay, 1e-2);

  EXPECT_EQ(OptimizerConfigFromProto(v1::OptimizerConfig()).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::OptimizerConfig bad;
  bad.mutable_adam()->set_beta1(1.0);
  EXPECT_EQ(OptimizerConfigFromProto(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(LayoutTest, PaddingIsFoundCheckedAndZeroed) {
  // "w" 10 elements at 0, "b" 3 at 16 (alignment 16), total 32 over 2 shards.
  const ModelLayout layout = ModelLayout::Create({{"w", {10}}, {"b", {3}}}, 16, 2).value();
  const FlatRange shard0 = layout.ShardRange(0), shard1 = layout.ShardRange(1);
  ASSERT_EQ(layout.PaddingIn(shard0).size(), 1u);
  EXPECT_EQ(layout.PaddingIn(shard0)[0].begin, 10u);
  EXPECT_EQ(layout.PaddingIn(shard0)[0].end, 16u);
  ASSERT_EQ(layout.PaddingIn(shard1).size(), 1u);
  EXPECT_EQ(layout.PaddingIn(shard1)[0].begin, 19u);
  EXPECT_EQ(layout.PaddingIn(shard1)[0].end, 32u);

  std::vector<float> values(shard1.size(), 1.0f);
  EXPECT_EQ(FindNonZeroPadding(layout, shard1, values.data(), DType::kFloat32), 19u);
  ZeroPadding(layout, shard1, values.data());
  EXPECT_EQ(FindNonZeroPadding(layout, shard1, values.data(), DType::kFloat32), std::nullopt);
  EXPECT_EQ(values[2], 1.0f);  // "b" untouched.
  values[31 - 16] = -0.0f;     // -0 is zero.
  EXPECT_EQ(FindNonZeroPadding(layout, shard1, values.data(), DType::kFloat32), std::nullopt);
  std::vector<uint16_t> half(shard1.size(), 0x8000);  // -0 in 16 bits.
  EXPECT_EQ(FindNonZeroPadding(layout, shard1, half.data(), DType::kBFloat16), std::nullopt);
  half[20 - 16] = 0x0001;  // The smallest subnormal.
  EXPECT_EQ(FindNonZeroPadding(layout, shard1, half.data(), DType::kFloat16), 20u);
}

}  // namespace
}  // namespace shardopt
