// CheckRangeTensors: what the CPU optimizer (Optimizer::Create) and the GPU
// backend (GpuBackend::Create) refuse, each in its words, and what they take.
#include "server/optim/range_tensor.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/optim/optimizer.h"

namespace shardopt {
namespace {

RangeTensor Piece(uint64_t offset, uint64_t size, uint32_t index, bool whole, uint64_t start = 0) {
  RangeTensor t;
  t.offset = offset;
  t.size = size;
  t.shape = {static_cast<int64_t>(size)};
  t.index = index;
  t.whole = whole;
  t.start = start;
  return t;
}

void ExpectRefused(OptimizerKind kind, uint64_t size, const std::vector<RangeTensor>& tensors,
                   const std::string& words) {
  const absl::Status s = CheckRangeTensors(kind, size, tensors);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(words), std::string::npos) << s;
  // The CPU optimizer refuses them with the same status.
  OptimizerConfig config = OptimizerConfig::Lamb();
  config.kind = kind;
  EXPECT_EQ(Optimizer::Create(config, size, tensors).status(), s);
}

TEST(CheckRangeTensorsTest, RefusesWhatNoOptimizerCanUpdate) {
  ExpectRefused(OptimizerKind::kLamb, 100, {Piece(0, 100, 4, false, 32)},
                "lamb cannot update a piece of tensor 4 starting at its element 32");
  ExpectRefused(OptimizerKind::kLamb, 50, {Piece(40, 20, 0, true)},
                "tensor [40, 60) is outside the range of 50");
}

TEST(CheckTrustTensorOrderTest, LambsTensorsNameDistinctLayoutTensorsInOrder) {
  const std::vector<RangeTensor> repeated = {Piece(0, 10, 3, true), Piece(10, 10, 3, true)};
  const absl::Status s = CheckTrustTensorOrder(OptimizerKind::kLamb, repeated);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("lamb's tensor pieces must name distinct layout tensors in order: "
                             "piece 1 names tensor 3 after 3"),
            std::string::npos)
      << s;
  EXPECT_TRUE(CheckTrustTensorOrder(OptimizerKind::kAdafactor, repeated).ok());
  EXPECT_TRUE(
      CheckTrustTensorOrder(OptimizerKind::kLamb, {Piece(0, 10, 3, true), Piece(10, 10, 4, true)})
          .ok());
}

TEST(CheckRangeTensorsTest, OnlyLambTakesPiecesOnANormBlock) {
  EXPECT_TRUE(CheckRangeTensors(OptimizerKind::kLamb, 100, {Piece(0, 100, 4, false, 128)}).ok());
  const absl::Status adafactor =
      CheckRangeTensors(OptimizerKind::kAdafactor, 100, {Piece(0, 100, 4, false, 128)});
  EXPECT_EQ(adafactor.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(adafactor.message().find("adafactor cannot update a piece of tensor 4"),
            std::string::npos)
      << adafactor;
  // Whole tensors of other optimizers need no order.
  EXPECT_TRUE(CheckRangeTensors(OptimizerKind::kAdafactor, 20,
                                {Piece(10, 10, 5, true), Piece(0, 10, 2, true)})
                  .ok());
}

}  // namespace
}  // namespace shardopt
