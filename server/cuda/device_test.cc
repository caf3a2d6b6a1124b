// Device selection and device memory (server/cuda/device.h) for
// //server/cuda:fused_optimizers_test, whose other file is
// fused_optimizers_test.cc: device-spec parsing, SelectDevice's answers with
// and without a GPU, each GPU selected by index, and device, pinned and
// stream-ordered copies with out-of-range and out-of-memory errors.
//
// Runs without a GPU: device-spec parsing and the "no GPU" error of
// SelectDevice (where a GPU exists, the same test checks the GPU side of that
// contract). The rest skips, saying why, without a usable GPU (and fails
// instead under SHARDOPT_REQUIRE_GPU=1: tests/support/gpu_required.h).
#include "server/cuda/device.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "server/cuda/fused_optimizers.h"
#include "server/cuda/gpu_test_util.h"

namespace shardopt {
namespace gpu {
namespace {

using ::shardopt::gpu::testing::GpuStatus;
using ::shardopt::gpu::testing::GpuTest;
using ::shardopt::gpu::testing::ValueOrDie;

TEST(DeviceSpecTest, Parses) {
  EXPECT_EQ(ValueOrDie(ParseDeviceSpec("cpu")).kind, DeviceSpec::Kind::kCpu);
  EXPECT_EQ(ValueOrDie(ParseDeviceSpec("auto")).kind, DeviceSpec::Kind::kAuto);
  EXPECT_EQ(ValueOrDie(ParseDeviceSpec("CUDA")).index, 0);
  EXPECT_EQ(ValueOrDie(ParseDeviceSpec("cuda:0")).index, 0);
  EXPECT_EQ(ValueOrDie(ParseDeviceSpec("cuda:13")).index, 13);
  EXPECT_EQ(ValueOrDie(ParseDeviceSpec("cuda:13")).ToString(), "cuda:13");
  for (const char* bad : {"", "gpu", "cuda:", "cuda:-1", "cuda:+1", "cuda:x", "cuda:1x", "cuda:0:1",
                          " cuda:0", "cuda:99999", "cuda0"}) {
    const absl::Status s = ParseDeviceSpec(bad).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << "\"" << bad << "\": " << s;
  }
}

TEST(DeviceSelectionTest, CpuIsNotAGpuAndSyntaxErrorsComeFirst) {
  EXPECT_EQ(SelectDevice("cpu").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SelectDevice("tpu:0").status().code(), absl::StatusCode::kInvalidArgument);
}

// Runs where there is no usable GPU (as on a build machine): the error must
// say so clearly, for every way of asking.
TEST(DeviceSelectionTest, WithoutAGpuSaysSoClearly) {
  if (GpuStatus().ok()) {
    // The other side of the same contract: every way of asking finds it, and
    // a GPU index that does not exist is still refused.
    for (const char* spec : {"auto", "cuda", "cuda:0"}) {
      absl::StatusOr<GpuInfo> gpu = SelectDevice(spec);
      ASSERT_TRUE(gpu.ok()) << spec << ": " << gpu.status();
      EXPECT_EQ(gpu->index, 0) << spec;
    }
    // The largest index the syntax takes (no machine has 1024 GPUs), and one
    // past it.
    EXPECT_EQ(SelectDevice("cuda:1023").status().code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(SelectDevice("cuda:4096").status().code(), absl::StatusCode::kInvalidArgument);
    return;
  }
  absl::StatusOr<std::vector<GpuInfo>> gpus = QueryGpus();
  const bool none_at_all = !gpus.ok();
  for (const char* spec : {"auto", "cuda", "cuda:0", "cuda:3"}) {
    const absl::Status s = SelectDevice(spec).status();
    EXPECT_FALSE(s.ok()) << spec;
    if (none_at_all) {
      EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << spec << ": " << s;
      EXPECT_NE(s.message().find("no CUDA GPU"), std::string::npos) << s;
    }
    std::fprintf(stderr, "[no gpu] SelectDevice(\"%s\"): %s\n", spec, s.ToString().c_str());
  }
  // A failed query leaves no error behind for later CUDA calls to report.
  EXPECT_EQ(QueryGpus().status().code(), gpus.status().code());
}

TEST_F(GpuTest, SelectsEachGpuAndRejectsMissingOnes) {
  const std::vector<GpuInfo> gpus = ValueOrDie(QueryGpus());
  ASSERT_FALSE(gpus.empty());
  for (const GpuInfo& g : gpus) {
    std::fprintf(stderr, "[gpu] %s bus %s L2 %zu KiB\n", g.DebugString().c_str(),
                 g.pci_bus_id.c_str(), g.l2_cache_bytes >> 10);
    absl::StatusOr<GpuInfo> selected = SelectDevice(absl::StrCat("cuda:", g.index));
    if (g.usable) {
      EXPECT_TRUE(selected.ok()) << selected.status();
    } else {
      EXPECT_EQ(selected.status().code(), absl::StatusCode::kFailedPrecondition);
    }
  }
  const absl::Status missing = SelectDevice(absl::StrCat("cuda:", gpus.size())).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound) << missing;
  // Leave the first usable GPU current for the other tests.
  ASSERT_TRUE(SelectDevice("auto").ok());
}

TEST_F(GpuTest, BuffersAllocateCopyAndReportOutOfMemory) {
  DeviceBuffer b = ValueOrDie(DeviceBuffer::Allocate(1000 * sizeof(float)));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % 256, 0u);
  std::vector<float> in(1000), out(1000, 0.0f);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) * 0.5f - 7.0f;
  ASSERT_OK(b.Upload(in.data(), in.size() * sizeof(float)));
  DeviceBuffer moved = std::move(b);
  EXPECT_EQ(b.data(), nullptr);
  ASSERT_OK(moved.Download(out.data(), out.size() * sizeof(float)));
  EXPECT_EQ(in, out);
  EXPECT_EQ(moved.Upload(in.data(), 8, 1000 * sizeof(float) - 4).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(moved.Download(out.data(), 1001 * sizeof(float)).code(), absl::StatusCode::kOutOfRange);

  PinnedBuffer pinned = ValueOrDie(PinnedBuffer::Allocate(1000 * sizeof(float)));
  Stream stream = ValueOrDie(Stream::Create());
  std::memcpy(pinned.data(), in.data(), 1000 * sizeof(float));
  DeviceBuffer other = ValueOrDie(DeviceBuffer::Allocate(1000 * sizeof(float)));
  ASSERT_OK(CopyToDevice(other.data(), pinned.data(), 1000 * sizeof(float), stream.get()));
  ASSERT_OK(CopyDeviceToDevice(moved.data(), other.data(), 1000 * sizeof(float), stream.get()));
  std::memset(pinned.data(), 0, 1000 * sizeof(float));
  ASSERT_OK(CopyToHost(pinned.data(), moved.data(), 1000 * sizeof(float), stream.get()));
  ASSERT_OK(stream.Synchronize());
  EXPECT_EQ(std::memcmp(pinned.data(), in.data(), 1000 * sizeof(float)), 0);

  // Far more than any GPU has: RESOURCE_EXHAUSTED, and the device stays usable.
  const absl::Status huge = DeviceBuffer::Allocate(size_t{1} << 50).status();
  EXPECT_EQ(huge.code(), absl::StatusCode::kResourceExhausted) << huge;
  ASSERT_OK(ConvertToBf16(moved.as<float>(), other.as<uint16_t>(), 1000));
  ASSERT_OK(SynchronizeStream());
}

}  // namespace
}  // namespace gpu
}  // namespace shardopt
