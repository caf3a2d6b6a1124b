#include "common/names.h"

#include <string>

#include "gtest/gtest.h"

namespace shardopt {
namespace {

TEST(QuotedTest, ShortTextIsQuotedWhole) { EXPECT_EQ(Quoted("mlp"), "'mlp'"); }

TEST(QuotedTest, LongTextIsCutAndSaysItsSize) {
  const std::string id(1 << 20, 'a');
  const std::string q = Quoted(id);
  EXPECT_EQ(q, "'" + std::string(kMaxQuotedBytes, 'a') + "...' (1048576 bytes)");
}

TEST(QuotedTest, UnprintableBytesAreEscaped) {
  EXPECT_EQ(Quoted(std::string("ck_b\0evil\n\\", 11)), "'ck_b\\x00evil\\x0a\\x5c'");
}

TEST(CheckIdTest, AcceptsPlainNames) {
  EXPECT_TRUE(CheckId("model_id", "mlp").ok());
  EXPECT_TRUE(CheckId("model_id", "my-model.g0_1").ok());
  EXPECT_TRUE(CheckId("model_id", std::string(kMaxIdBytes, 'x')).ok());
}

TEST(CheckIdTest, RefusesEmptyLongOddAndHiddenNames) {
  for (const std::string& bad :
       {std::string(), std::string(kMaxIdBytes + 1, 'x'), std::string("a/b"),
        std::string("a\0b", 3), std::string(".hidden"), std::string("sp ace")}) {
    absl::Status s = CheckId("model_id", bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << Quoted(bad);
    EXPECT_NE(s.message().find("model_id"), absl::string_view::npos);
    EXPECT_LT(s.message().size(), 200u);
  }
}

TEST(CheckTensorNameTest, Bounds) {
  EXPECT_TRUE(CheckTensorName("fc1.weight").ok());
  EXPECT_TRUE(CheckTensorName("layers/0/attn weight").ok());
  EXPECT_EQ(CheckTensorName("").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckTensorName(std::string(kMaxTensorNameBytes + 1, 'w')).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckTensorName(std::string("w\0", 2)).code(), absl::StatusCode::kInvalidArgument);
}

TEST(CheckPathTest, RefusesNulLongAndOverlongComponents) {
  EXPECT_TRUE(CheckPath("directory", "/tmp/ckpt/mlp").ok());
  absl::Status nul = CheckPath("directory", std::string("/tmp/ck_b\0evil", 14));
  EXPECT_EQ(nul.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(nul.message().find("NUL"), absl::string_view::npos) << nul;
  EXPECT_EQ(CheckPath("directory", "").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckPath("directory", "/tmp/" + std::string(5000, 'n')).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckPath("directory", "/tmp/" + std::string(256, 'n') + "/x").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckPath("directory", "/tmp/" + std::string(255, 'n')).ok());
}

TEST(CheckPathInsideTest, OnlyBelowTheRootWithoutClimbing) {
  EXPECT_TRUE(CheckPathInside("directory", "/ckpt/mlp/step-1", "/ckpt").ok());
  EXPECT_TRUE(CheckPathInside("directory", "/ckpt/mlp", "/ckpt/").ok());
  for (const char* bad : {"/ckpt", "/ckpt/", "/ckptx/mlp", "/etc/passwd", "/ckpt/../etc",
                          "/ckpt/./x", "ckpt/mlp", "/ckpt/a/../../etc"}) {
    EXPECT_EQ(CheckPathInside("directory", bad, "/ckpt").code(),
              absl::StatusCode::kPermissionDenied)
        << bad;
  }
  EXPECT_EQ(CheckPathInside("directory", std::string("/ckpt/a\0b", 9), "/ckpt").code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardopt
