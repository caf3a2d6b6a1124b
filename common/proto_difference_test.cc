// Differences between two configs, in words.
#include "common/proto_difference.h"

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.pb.h"

namespace shardopt {
namespace {

v1::ModelConfig Base() {
  v1::ModelConfig c;
  c.set_model_id("m");
  c.set_num_trainers(2);
  v1::TensorSpec* t = c.mutable_layout()->add_tensors();
  t->set_name("w");
  t->add_shape(3);
  t->add_shape(4);
  c.mutable_optimizer()->mutable_adamw()->set_lr(0.001);
  return c;
}

TEST(ProtoDifferenceTest, NamesEachDifferingFieldWithBothValues) {
  const v1::ModelConfig a = Base();
  EXPECT_EQ(DescribeDifferences(a, a, "registered", "this trainer"), "");
  v1::ModelConfig b = a;
  b.set_num_trainers(3);
  b.mutable_optimizer()->mutable_adamw()->set_lr(0.002);
  const std::string d = DescribeDifferences(a, b, "registered", "this trainer");
  EXPECT_TRUE(absl::StrContains(d, "num_trainers: registered 2, this trainer 3")) << d;
  EXPECT_TRUE(absl::StrContains(d, "optimizer.adamw.lr: registered 0.001, this trainer 0.002"))
      << d;
}

TEST(ProtoDifferenceTest, OneofsRepeatedFieldsAndTheLimit) {
  const v1::ModelConfig a = Base();
  v1::ModelConfig b = a;
  b.mutable_optimizer()->mutable_sgd()->set_lr(0.1);  // Another optimizer.
  std::string d = DescribeDifferences(a, b, "registered", "this trainer");
  EXPECT_TRUE(absl::StrContains(d, "optimizer.adamw: registered {lr: 0.001}, this trainer (unset)"))
      << d;
  EXPECT_TRUE(absl::StrContains(d, "optimizer.sgd: registered (unset), this trainer {lr: 0.1}"))
      << d;
  b = a;
  b.mutable_layout()->mutable_tensors(0)->set_shape(1, 5);
  d = DescribeDifferences(a, b, "registered", "this trainer");
  EXPECT_TRUE(absl::StrContains(d, "layout.tensors[0].shape: registered 4, this trainer 5")) << d;
  b = a;
  b.set_num_trainers(9);
  b.set_model_id("other");
  b.set_shard_count(4);
  d = DescribeDifferences(a, b, "a", "b", /*max_fields=*/2);
  EXPECT_TRUE(absl::StrContains(d, "; and 1 more")) << d;
}

}  // namespace
}  // namespace shardopt
