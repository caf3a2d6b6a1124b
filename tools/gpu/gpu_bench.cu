// gpu_bench: how close the fused AdamW step comes to the GPU's memory
// bandwidth.
//
//   gpu_bench [--sizes=64M,1G] [--iters=20] [--warmup=3]
//
// For each size (fp32 parameters; K = 2^10, M = 2^20, G = 2^30) it times,
// with CUDA events around each launch, the median of --iters runs after
// --warmup untimed ones:
//   adamw T=1        FusedOptimizerStep, AdamW, one gradient buffer:
//                    28 B/param (g, p, m, v read; p, m, v written)
//   adamw T=1 +bf16  the same plus the bf16 copy: 30 B/param
//   adamw T=3        three gradient buffers reduced (mean): 36 B/param
//   lamb measure     LAMB's measure pass (server/cuda/lamb_kernels.h) over
//                    one tensor: 16 B/param read (p, g, m, v), sums of 64
//                    elements written (counted as 16 B/param)
//   lamb apply       LAMB's apply pass: 28 B/param, as AdamW's
//   adafactor step   Adafactor's whole step (server/cuda/adafactor_step.h)
//                    on one square matrix of n elements (n a square; else
//                    the nearest square below), host sums included:
//                    counted as 28 B/param (p read for its norm, g read for
//                    the row and the column factors, g and the factors for
//                    U's norm, g and p read and p written to apply); then
//                    its passes one by one: sums of p^2, row factors,
//                    column blocks, sums of U^2 (4 B/param each) and the
//                    apply (12 B/param)
//   D2D copy         cudaMemcpyAsync device-to-device of 4 B/param, counted
//                    as 8 B/param (read + write): the bandwidth ceiling
// and prints bytes/s and the fraction of the copy's bytes/s. Data are random
// (never zeros). The last lines are machine-readable:
//   RESULT kind=<adamw_t1|adamw_t1_bf16|adamw_t3|lamb_measure|lamb_apply|adafactor_step|
//                adafactor_piece_sums|adafactor_rows|adafactor_column_blocks|
//                adafactor_update_sums|adafactor_apply|d2d_copy>
//          n=<params> median_ms=<..>
//          gbps=<..> bytes_per_param=<..> frac_of_copy=<..>
// Exit status: 0 on success, 3 when there is no usable GPU (message on
// stderr), 1 on any other error.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/optimizer_config.h"
#include "server/cuda/device.h"
#include "server/cuda/fused_optimizers.h"
#include "server/cuda/adafactor_kernels.h"
#include "server/cuda/adafactor_step.h"
#include "server/cuda/lamb_kernels.h"

namespace shardopt {
namespace gpu {
namespace {

#define BENCH_CHECK_CUDA(call)                                           \
  do {                                                                   \
    const cudaError_t bench_err_ = (call);                               \
    if (bench_err_ != cudaSuccess) {                                     \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, \
                   cudaGetErrorString(bench_err_));                      \
      std::exit(1);                                                      \
    }                                                                    \
  } while (0)

void CheckOk(const absl::Status& s, const char* what) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, s.ToString().c_str());
    std::exit(1);
  }
}

template <typename T>
T Unwrap(absl::StatusOr<T> v, const char* what) {
  CheckOk(v.status(), what);
  return *std::move(v);
}

__device__ __forceinline__ uint32_t Hash(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// dst[i] = lo + (hi - lo) * u(seed, i), u uniform in [0, 1).
__global__ void FillUniform(float* dst, size_t n, uint64_t seed, float lo, float hi) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float u =
        static_cast<float>(Hash(seed * 0x9e3779b97f4a7c15ull + i) >> 8) * (1.0f / 16777216.0f);
    dst[i] = lo + (hi - lo) * u;
  }
}

void Fill(float* dst, size_t n, uint64_t seed, float lo, float hi) {
  FillUniform<<<1024, 256>>>(dst, n, seed, lo, hi);
  BENCH_CHECK_CUDA(cudaGetLastError());
}

size_t ParseSize(const std::string& s) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  size_t mult = 1;
  if (*end == 'K' || *end == 'k') mult = size_t{1} << 10;
  if (*end == 'M' || *end == 'm') mult = size_t{1} << 20;
  if (*end == 'G' || *end == 'g') mult = size_t{1} << 30;
  if (v <= 0) {
    std::fprintf(stderr, "bad size \"%s\"\n", s.c_str());
    std::exit(1);
  }
  return static_cast<size_t>(v * static_cast<double>(mult));
}

std::string SizeName(size_t n) {
  char buf[32];
  if (n % (size_t{1} << 30) == 0) {
    std::snprintf(buf, sizeof(buf), "%zuG", n >> 30);
  } else if (n % (size_t{1} << 20) == 0) {
    std::snprintf(buf, sizeof(buf), "%zuM", n >> 20);
  } else {
    std::snprintf(buf, sizeof(buf), "%zu", n);
  }
  return buf;
}

// Median of `iters` event-timed runs of `run` after `warmup` untimed ones.
template <typename F>
double MedianMs(int warmup, int iters, F run) {
  cudaEvent_t start, stop;
  BENCH_CHECK_CUDA(cudaEventCreate(&start));
  BENCH_CHECK_CUDA(cudaEventCreate(&stop));
  for (int i = 0; i < warmup; ++i) run();
  BENCH_CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    BENCH_CHECK_CUDA(cudaEventRecord(start));
    run();
    BENCH_CHECK_CUDA(cudaEventRecord(stop));
    BENCH_CHECK_CUDA(cudaEventSynchronize(stop));
    float t = 0;
    BENCH_CHECK_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  BENCH_CHECK_CUDA(cudaEventDestroy(start));
  BENCH_CHECK_CUDA(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  const size_t m = ms.size() / 2;
  return ms.size() % 2 ? ms[m] : 0.5 * (ms[m - 1] + ms[m]);
}

struct Row {
  std::string size;
  size_t n;
  std::string kind;
  std::string label;
  double bytes_per_param;
  double ms;
  double gbps;
  double frac;
};

int Main(int argc, char** argv) {
  std::vector<size_t> sizes = {size_t{64} << 20, size_t{1} << 30};
  int iters = 20;
  int warmup = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--sizes=", 0) == 0) {
      sizes.clear();
      std::string list = a.substr(8);
      size_t pos = 0;
      while (pos <= list.size()) {
        const size_t comma = std::min(list.find(',', pos), list.size());
        if (comma > pos) sizes.push_back(ParseSize(list.substr(pos, comma - pos)));
        pos = comma + 1;
      }
    } else if (a.rfind("--iters=", 0) == 0) {
      iters = std::max(1, std::atoi(a.c_str() + 8));
    } else if (a.rfind("--warmup=", 0) == 0) {
      warmup = std::max(0, std::atoi(a.c_str() + 9));
    } else {
      std::fprintf(stderr, "usage: gpu_bench [--sizes=64M,1G] [--iters=20] [--warmup=3]\n");
      return 1;
    }
  }

  absl::StatusOr<GpuInfo> gpu = SelectDevice("auto");
  if (!gpu.ok()) {
    std::fprintf(stderr, "gpu_bench: %s\n", gpu.status().ToString().c_str());
    return 3;
  }
  std::printf("GPU: %s\n", gpu->DebugString().c_str());
  std::printf("median of %d event-timed runs after %d warm-up runs; GB/s = 1e9 B/s\n\n", iters,
              warmup);

  std::vector<Row> rows;
  const OptimizerConfig adamw = OptimizerConfig::AdamW(1e-3);  // weight_decay 1e-2
  for (size_t n : sizes) {
    const size_t fbytes = n * sizeof(float);
    DeviceBuffer g0 = Unwrap(DeviceBuffer::Allocate(fbytes), "grad 0");
    DeviceBuffer g1 = Unwrap(DeviceBuffer::Allocate(fbytes), "grad 1");
    DeviceBuffer g2 = Unwrap(DeviceBuffer::Allocate(fbytes), "grad 2");
    DeviceBuffer p = Unwrap(DeviceBuffer::Allocate(fbytes), "params");
    DeviceBuffer m = Unwrap(DeviceBuffer::Allocate(fbytes), "exp_avg");
    DeviceBuffer v = Unwrap(DeviceBuffer::Allocate(fbytes), "exp_avg_sq");
    DeviceBuffer bf16 = Unwrap(DeviceBuffer::Allocate(n * sizeof(uint16_t)), "bf16");
    DeviceBuffer copy_src = Unwrap(DeviceBuffer::Allocate(fbytes), "copy src");
    DeviceBuffer copy_dst = Unwrap(DeviceBuffer::Allocate(fbytes), "copy dst");
    Fill(g0.as<float>(), n, 1, -1.0f, 1.0f);
    Fill(g1.as<float>(), n, 2, -1.0f, 1.0f);
    Fill(g2.as<float>(), n, 3, -1.0f, 1.0f);
    Fill(p.as<float>(), n, 4, -0.5f, 0.5f);
    Fill(m.as<float>(), n, 5, -0.01f, 0.01f);
    Fill(v.as<float>(), n, 6, 0.0f, 1e-4f);
    Fill(copy_src.as<float>(), n, 7, -1.0f, 1.0f);
    Fill(copy_dst.as<float>(), n, 8, -1.0f, 1.0f);
    BENCH_CHECK_CUDA(cudaDeviceSynchronize());

    const float* grads[3] = {g0.as<float>(), g1.as<float>(), g2.as<float>()};
    FusedStepBuffers b;
    b.gradients = grads;
    b.params = p.as<float>();
    b.slots = {m.as<float>(), v.as<float>(), nullptr};
    int64_t step = 0;
    auto run = [&](int trainers, bool with_bf16) {
      FusedStepBuffers bb = b;
      bb.num_gradients = trainers;
      bb.params_bf16 = with_bf16 ? bf16.as<uint16_t>() : nullptr;
      CheckOk(FusedOptimizerStep(adamw, ++step, n, bb), "FusedOptimizerStep");
    };
    CheckOk(SynchronizeStream(), "warm-up");

    const double copy_ms = MedianMs(warmup, iters, [&] {
      BENCH_CHECK_CUDA(
          cudaMemcpyAsync(copy_dst.data(), copy_src.data(), fbytes, cudaMemcpyDeviceToDevice));
    });
    const double copy_gbps = 8.0 * n / (copy_ms * 1e-3) / 1e9;
    struct Variant {
      const char* kind;
      const char* label;
      int trainers;
      bool bf16;
      double bytes;
    };
    const Variant variants[] = {
        {"adamw_t1", "fused AdamW T=1", 1, false, 28.0},
        {"adamw_t1_bf16", "fused AdamW T=1 +bf16", 1, true, 30.0},
        {"adamw_t3", "fused AdamW T=3 (mean)", 3, false, 36.0},
    };
    for (const Variant& var : variants) {
      const double ms = MedianMs(warmup, iters, [&] { run(var.trainers, var.bf16); });
      const double gbps = var.bytes * n / (ms * 1e-3) / 1e9;
      rows.push_back({SizeName(n), n, var.kind, var.label, var.bytes, ms, gbps, gbps / copy_gbps});
    }
    {
      // LAMB on one tensor of n elements: its blocks of 64, as LambPlan
      // makes them (the host half, exact sums and step sizes, not timed).
      std::vector<TrustBlock> blocks;
      for (size_t b = 0; b < n; b += kLambBlockElements) {
        blocks.push_back(TrustBlock{b, static_cast<uint32_t>(std::min<size_t>(kLambBlockElements,
                                                                              n - b)),
                                    0});
      }
      DeviceBuffer device_blocks =
          Unwrap(DeviceBuffer::Allocate(blocks.size() * sizeof(TrustBlock)), "lamb blocks");
      CheckOk(device_blocks.Upload(blocks.data(), blocks.size() * sizeof(TrustBlock)), "upload");
      DeviceBuffer sums = Unwrap(DeviceBuffer::Allocate(2 * blocks.size() * sizeof(double)), "sums");
      const float step_size = 1e-3f;
      DeviceBuffer step_sizes = Unwrap(DeviceBuffer::Allocate(sizeof(float)), "step size");
      CheckOk(step_sizes.Upload(&step_size, sizeof(float)), "upload");
      const LambKernelScalars scalars{0.9f, 0.1f, 0.999f, 0.001f, 0.5f, 0.25f, 1e-6f, 0.01f,
                                      1.0f, 0};
      const LambMeasureArgs measure{device_blocks.as<TrustBlock>(),
                                    blocks.size(),
                                    p.as<float>(),
                                    g0.as<float>(),
                                    m.as<float>(),
                                    v.as<float>(),
                                    scalars,
                                    sums.as<double>(),
                                    sums.as<double>() + blocks.size()};
      const LambApplyArgs apply{device_blocks.as<TrustBlock>(),
                                blocks.size(),
                                p.as<float>(),
                                g0.as<float>(),
                                m.as<float>(),
                                v.as<float>(),
                                scalars,
                                step_sizes.as<float>()};
      const double measure_ms =
          MedianMs(warmup, iters, [&] { CheckOk(LambMeasure(measure, nullptr), "LambMeasure"); });
      const double apply_ms =
          MedianMs(warmup, iters, [&] { CheckOk(LambApply(apply, nullptr), "LambApply"); });
      for (auto [kind, label, bytes, ms] :
           {std::tuple{"lamb_measure", "LAMB measure pass", 16.0, measure_ms},
            std::tuple{"lamb_apply", "LAMB apply pass", 28.0, apply_ms}}) {
        const double gbps = bytes * n / (ms * 1e-3) / 1e9;
        rows.push_back({SizeName(n), n, kind, label, bytes, ms, gbps, gbps / copy_gbps});
      }
    }
    {
      const size_t side = static_cast<size_t>(std::sqrt(static_cast<double>(n)));
      RangeTensor matrix;
      matrix.size = side * side;
      matrix.shape = {static_cast<int64_t>(side), static_cast<int64_t>(side)};
      const AdafactorPlan plan({matrix}, {0}, {0});
      DeviceBuffer row_var = Unwrap(DeviceBuffer::Allocate(side * sizeof(float)), "row_var");
      DeviceBuffer col_var = Unwrap(DeviceBuffer::Allocate(side * sizeof(float)), "col_var");
      CheckOk(row_var.Fill(0, side * sizeof(float)), "fill");
      CheckOk(col_var.Fill(0, side * sizeof(float)), "fill");
      DeviceBuffer sums = Unwrap(DeviceBuffer::Allocate(plan.max_pieces() * sizeof(double)), "sums");
      DeviceBuffer denominators = Unwrap(DeviceBuffer::Allocate(sizeof(float)), "denominators");
      DeviceBuffer partials = Unwrap(
          DeviceBuffer::Allocate(plan.max_column_partials() * sizeof(double)), "column partials");
      std::vector<double> host_sums(plan.max_pieces());
      const OptimizerConfig adafactor = OptimizerConfig::Adafactor();
      int64_t adafactor_step = 0;
      const double ms = MedianMs(warmup, iters, [&] {
        CheckOk(plan.Step(adafactor, ++adafactor_step, p.as<float>(), g0.as<float>(),
                          row_var.as<float>(), col_var.as<float>(), sums.as<double>(),
                          host_sums.data(), denominators.as<float>(),
                          partials.as<double>(), nullptr),
                "Adafactor step");
      });
      const double gbps = 28.0 * matrix.size / (ms * 1e-3) / 1e9;
      rows.push_back({SizeName(n), n, "adafactor_step", "Adafactor step (all)", 28.0, ms, gbps,
                      gbps / copy_gbps});
      // Its passes one by one (where the step's time goes), with the
      // factors the step left.
      const AdafactorShape& shape = plan.tensors()[0].shape;
      const AdafactorUpdateArgs update{shape, g0.as<float>(), row_var.as<float>(),
                                       col_var.as<float>(), denominators.as<float>(), 1.0f,
                                       1e-30f};
      struct Pass {
        const char* kind;
        const char* label;
        double bytes;
        double ms;
      };
      const Pass passes[] = {
          {"adafactor_piece_sums", "Adafactor: sums of p^2", 4.0, MedianMs(warmup, iters, [&] {
             CheckOk(PieceSquares(p.as<float>(), shape, sums.as<double>(), nullptr), "pieces");
           })},
          {"adafactor_rows", "Adafactor: row factors", 4.0, MedianMs(warmup, iters, [&] {
             CheckOk(FactorRows(g0.as<float>(), row_var.as<float>(), shape, 0.5f,
                                sums.as<double>(), nullptr),
                     "rows");
           })},
          {"adafactor_column_blocks", "Adafactor: column blocks", 4.0,
           MedianMs(warmup, iters, [&] {
             CheckOk(FactorColumnBlocks(g0.as<float>(), partials.as<double>(), shape, nullptr),
                     "columns");
           })},
          {"adafactor_update_sums", "Adafactor: sums of U^2", 4.0, MedianMs(warmup, iters, [&] {
             CheckOk(UpdateSquares(update, sums.as<double>(), nullptr), "update sums");
           })},
          {"adafactor_apply", "Adafactor: apply", 12.0, MedianMs(warmup, iters, [&] {
             CheckOk(ApplyUpdate(update, p.as<float>(), 0.0f, nullptr), "apply");
           })},
      };
      for (const Pass& pass : passes) {
        const double pass_gbps = pass.bytes * matrix.size / (pass.ms * 1e-3) / 1e9;
        rows.push_back({SizeName(n), n, pass.kind, pass.label, pass.bytes, pass.ms, pass_gbps,
                        pass_gbps / copy_gbps});
      }
    }
    rows.push_back({SizeName(n), n, "d2d_copy", "D2D cudaMemcpy", 8.0, copy_ms, copy_gbps, 1.0});
    CheckOk(SynchronizeStream(), "benchmark");

    // The parameters must still be finite numbers (a broken kernel shows here).
    std::vector<float> sample(16);
    CheckOk(p.Download(sample.data(), sample.size() * sizeof(float)), "download");
    for (float x : sample) {
      if (!std::isfinite(x)) {
        std::fprintf(stderr, "non-finite parameter after the benchmark: %g\n", x);
        return 1;
      }
    }
  }

  std::printf("%-7s %-24s %8s %10s %9s %9s\n", "params", "kernel", "B/param", "median ms", "GB/s",
              "of copy");
  for (const Row& r : rows) {
    std::printf("%-7s %-24s %8.0f %10.3f %9.1f %8.1f%%\n", r.size.c_str(), r.label.c_str(),
                r.bytes_per_param, r.ms, r.gbps, 100.0 * r.frac);
  }
  std::printf("\n");
  for (const Row& r : rows) {
    std::printf(
        "RESULT kind=%s n=%zu median_ms=%.4f gbps=%.1f bytes_per_param=%.0f "
        "frac_of_copy=%.4f\n",
        r.kind.c_str(), r.n, r.ms, r.gbps, r.bytes_per_param, r.frac);
  }
  return 0;
}

}  // namespace
}  // namespace gpu
}  // namespace shardopt

int main(int argc, char** argv) { return shardopt::gpu::Main(argc, argv); }
