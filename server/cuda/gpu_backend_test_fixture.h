// Internal to //server/cuda:gpu_backend_test: its fixture (a GPU or a
// skip, and shards on the CPU or GPU backend made as the server makes them)
// and the comparison of two shards' parameters, for its two source files.
#ifndef SHARDOPT_SERVER_CUDA_GPU_BACKEND_TEST_FIXTURE_H_
#define SHARDOPT_SERVER_CUDA_GPU_BACKEND_TEST_FIXTURE_H_

#include <cstring>
#include <initializer_list>
#include <memory>
#include <vector>

#include "common/dtype.h"
#include "gtest/gtest.h"
#include "server/cuda/device.h"
#include "server/device_support.h"
#include "server/model_shard.h"
#include "server/parallel_for.h"
#include "tests/support/gpu_required.h"

namespace shardopt {

// The two shards' parameters at `version`, pulled as `dtype`: the same bits.
inline void ExpectSameParameters(ModelShard& cpu, ModelShard& gpu, int64_t version,
                                 DType dtype = DType::kFloat32) {
  const size_t bytes = cpu.size() * DTypeSize(dtype);
  std::vector<char> want(bytes), got(gpu.size() * DTypeSize(dtype));
  ASSERT_TRUE(cpu.ReadParameters(version, 0, cpu.size(), dtype, want.data()).ok());
  ASSERT_TRUE(gpu.ReadParameters(version, 0, gpu.size(), dtype, got.data()).ok());
  ASSERT_EQ(want.size(), got.size());
  EXPECT_EQ(std::memcmp(want.data(), got.data(), bytes), 0)
      << DTypeName(dtype) << " parameters at version " << version;
}

// The two shards' optimizer state slots `slots` at `version`, read as a
// checkpoint reads them: the same bits.
inline void ExpectSameSlots(ModelShard& cpu, ModelShard& gpu, int64_t version,
                            std::initializer_list<int> slots) {
  for (int slot : slots) {
    std::vector<std::vector<float>> state(2, std::vector<float>(cpu.size()));
    int k = 0;
    for (ModelShard* shard : {&cpu, &gpu}) {
      std::vector<float>& out = state[k++];
      ASSERT_TRUE(shard
                      ->CheckpointAt(version, absl::Now() + absl::Seconds(30), nullptr,
                                     [&](const ShardProgress&, const ShardStateReadFn& read) {
                                       return read(slot, 0, out.size(), out.data());
                                     })
                      .ok());
    }
    EXPECT_EQ(std::memcmp(state[0].data(), state[1].data(), state[0].size() * sizeof(float)), 0)
        << "slot " << slot << " at version " << version;
  }
}

class GpuBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<gpu::GpuInfo> gpu = gpu::SelectDevice("auto");
    if (!gpu.ok()) SHARDOPT_GPU_UNAVAILABLE("no usable GPU: " << gpu.status());
    gpu_index_ = gpu->index;
  }

  std::unique_ptr<ModelShard> MakeShard(const ModelShardOptions& options,
                                        const std::vector<float>& init, bool on_gpu) {
    if (!on_gpu) return ModelShard::Create(options, init, &pool_).value();
    return ModelShard::Create(
               options, init,
               [this](const ModelShardOptions& o,
                      std::vector<float> v) -> absl::StatusOr<std::unique_ptr<UpdateBackend>> {
                 // As the server makes it (Muon's matrices from the layout).
                 return MakeGpuBackend(gpu_index_, o, v);
               })
        .value();
  }

  int gpu_index_ = -1;
  ThreadPool pool_{2};
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CUDA_GPU_BACKEND_TEST_FIXTURE_H_
