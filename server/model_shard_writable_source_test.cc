// ModelShard::PushWriter::Write from memory the trainer can still write
// (Source::kTrainerWritable: its shared segment): padding is checked on the
// staged copy, so a trainer that writes its padding between the shard's
// check and its copy cannot get a non-zero padding gradient staged. A
// backend that writes the source during Stage (as such a trainer would,
// between a check of the source and the copy) makes the race certain.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/forwarding_backend_testing.h"
#include "server/model_shard.h"
#include "server/model_shard_testing.h"
#include "server/optim/optimizer.h"

namespace shardopt {
namespace {

using testing::kShard;
using testing::RandomGradient;
using testing::ReadAll;
using testing::TestLayout;

// A CPU backend that, in Stage, first writes `value` at source element
// `at` of the chunk holding it: the trainer writing its segment while the
// shard reads it. Without `host_staging`, its staging is not in host memory
// to the shard (as a GPU backend's is not): the shard asks ScanStaged.
class SourceWritingBackend final : public testing::ForwardingBackend {
 public:
  SourceWritingBackend(std::unique_ptr<UpdateBackend> cpu, uint64_t at, float value,
                       bool host_staging)
      : ForwardingBackend(std::move(cpu)), at_(at), value_(value), host_staging_(host_staging) {}
  absl::StatusOr<size_t> Stage(uint32_t rank, uint64_t offset, const void* data, DType dtype,
                               size_t count) override {
    if (dtype == DType::kFloat32 && at_ >= offset && at_ < offset + count) {
      // (The test's own buffer: writable, as a trainer's segment is.)
      std::memcpy(static_cast<float*>(const_cast<void*>(data)) + (at_ - offset), &value_, 4);
    }
    return inner().Stage(rank, offset, data, dtype, count);
  }
  float* HostStaging(uint32_t rank, uint64_t offset, uint64_t count) override {
    return host_staging_ ? inner().HostStaging(rank, offset, count) : nullptr;
  }
  absl::StatusOr<StagedScan> ScanStaged(uint32_t rank, uint64_t offset, uint64_t count,
                                        absl::Span<const FlatRange> must_be_zero) override {
    ++scans;
    return inner().ScanStaged(rank, offset, count, must_be_zero);
  }
  absl::Status ReadStaged(uint32_t rank, uint64_t offset, uint64_t count, float* out) override {
    return inner().ReadStaged(rank, offset, count, out);
  }

  int scans = 0;

 private:
  const uint64_t at_;
  const float value_;
  const bool host_staging_;
};

std::unique_ptr<ModelShard> ShardWritingSourceAt(ThreadPool* pool, uint64_t at, float value,
                                                 bool host_staging = true,
                                                 SourceWritingBackend** made = nullptr) {
  ModelShardOptions options{"m", TestLayout(), kShard, OptimizerConfig::AdamW(0.01), 1, true};
  std::vector<float> init(options.layout.ShardSize(kShard));
  for (size_t i = 0; i < init.size(); ++i) init[i] = 0.002f * static_cast<float>(i % 89);
  testing::ZeroPadding(options.layout, kShard, &init);
  const ModelShard::BackendFactory cpu = ModelShard::CpuBackendFactory(pool);
  return ModelShard::Create(
             std::move(options), std::move(init),
             [&](const ModelShardOptions& o,
                 std::vector<float> v) -> absl::StatusOr<std::unique_ptr<UpdateBackend>> {
               absl::StatusOr<std::unique_ptr<UpdateBackend>> backend = cpu(o, std::move(v));
               if (!backend.ok()) return backend.status();
               auto writing = std::make_unique<SourceWritingBackend>(*std::move(backend), at, value,
                                                                     host_staging);
               if (made != nullptr) *made = writing.get();
               return writing;
             })
      .value();
}

// Pushes `grad` in chunks of `chunk` from `source`.
absl::StatusOr<PushResult> Push(ModelShard& shard, int64_t step, std::vector<float> grad,
                                size_t chunk, ModelShard::PushWriter::Source source) {
  absl::StatusOr<ModelShard::PushStart> start = shard.BeginPush(0, step, grad.size());
  if (!start.ok()) return start.status();
  if (start->immediate) return *start->immediate;
  for (uint64_t off = 0; off < grad.size(); off += chunk) {
    const uint64_t count = std::min<uint64_t>(chunk, grad.size() - off);
    if (absl::Status s =
            start->writer->Write(off, grad.data() + off, count * sizeof(float), source);
        !s.ok()) {
      return s;
    }
  }
  return start->writer->Commit();
}

// With the staging in host memory, and elsewhere (a GPU's: ScanStaged).
TEST(ModelShardWritableSourceTest, PaddingWrittenDuringTheCopyIsRefused) {
  for (const bool host_staging : {true, false}) {
    SCOPED_TRACE(host_staging ? "host staging" : "staging elsewhere");
    ThreadPool pool(1);
    const FlatRange range = TestLayout().ShardRange(kShard);
    const std::vector<FlatRange> padding = TestLayout().PaddingIn(range);
    ASSERT_FALSE(padding.empty());
    const uint64_t at = padding.front().begin - range.begin;
    SourceWritingBackend* backend = nullptr;
    std::unique_ptr<ModelShard> shard =
        ShardWritingSourceAt(&pool, at, 0.25f, host_staging, &backend);
    const std::vector<float> before = ReadAll(*shard, 0);
    const std::vector<float> g = RandomGradient(0, 1, shard->size());
    ASSERT_EQ(g[at], 0.0f);

    absl::StatusOr<PushResult> refused =
        Push(*shard, 1, g, 333, ModelShard::PushWriter::Source::kTrainerWritable);
    ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
    EXPECT_NE(refused.status().message().find("padding gets zero gradients"), std::string::npos)
        << refused.status();
    EXPECT_NE(refused.status().message().find("is 0.25"), std::string::npos) << refused.status();
    EXPECT_EQ(shard->version(), 0);
    const std::vector<float> after = ReadAll(*shard, 0);
    ASSERT_EQ(after.size(), before.size());
    EXPECT_EQ(std::memcmp(after.data(), before.data(), after.size() * 4), 0);
    ASSERT_NE(backend, nullptr);
    EXPECT_EQ(backend->scans > 0, !host_staging);
  }
}

// Bytes of the shard's own are checked before staging, as they were read.
TEST(ModelShardWritableSourceTest, OwnBytesAreCheckedBeforeTheCopy) {
  ThreadPool pool(1);
  const FlatRange range = TestLayout().ShardRange(kShard);
  const std::vector<FlatRange> padding = TestLayout().PaddingIn(range);
  ASSERT_FALSE(padding.empty());
  const uint64_t at = padding.front().begin - range.begin;
  std::unique_ptr<ModelShard> shard = ShardWritingSourceAt(&pool, at, 0.0f);
  std::vector<float> g = RandomGradient(0, 1, shard->size());
  g[at] = -0.5f;
  absl::StatusOr<PushResult> refused =
      Push(*shard, 1, g, 333, ModelShard::PushWriter::Source::kShardOwned);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("is -0.5"), std::string::npos) << refused.status();
  // A clean push from either source then goes through.
  g[at] = 0.0f;
  EXPECT_TRUE(Push(*shard, 1, g, 333, ModelShard::PushWriter::Source::kTrainerWritable).ok());
  EXPECT_EQ(shard->version(), 1);
}

}  // namespace
}  // namespace shardopt
