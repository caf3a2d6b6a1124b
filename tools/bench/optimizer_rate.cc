// shardopt_bench section (c): optimizer update rate and memcpy reference
// (optimizer_rate.h).
#include "tools/bench/optimizer_rate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/layout.h"
#include "common/optimizer_config.h"
#include "common/step_protocol.h"
#include "server/cpu_backend.h"
#include "server/optim/blas.h"
#include "server/optim/optimizer.h"
#include "server/parallel_for.h"
#include "tools/bench/bench_util.h"
#include "tools/bench/workload.h"

namespace shardopt::bench {
namespace {

struct CopyRate {
  int threads = 0;
  double seconds = 0;  // Median per copy.
  double gbps = 0;     // Read + write bytes.
};

std::vector<CopyRate> RunMemcpy(size_t bytes, const std::vector<int>& thread_counts,
                                double seconds) {
  std::vector<char> src(bytes), dst(bytes);
  for (size_t i = 0; i < bytes; i += 4096) src[i] = static_cast<char>(i >> 12);
  std::memset(dst.data(), 1, bytes);
  std::vector<CopyRate> rates;
  for (int t : thread_counts) {
    ThreadPool pool(t);
    std::vector<double> times = TimeRepeated(seconds, 3, 100000, [&] {
      pool.ParallelFor(bytes, 4096, [&](size_t begin, size_t end) {
        std::memcpy(dst.data() + begin, src.data() + begin, end - begin);
      });
    });
    CopyRate r;
    r.threads = t;
    r.seconds = Median(times);
    r.gbps = 2.0 * static_cast<double>(bytes) / r.seconds / 1e9;
    rates.push_back(r);
  }
  return rates;
}

struct OptimizerCase {
  std::string name;
  OptimizerConfig config;
  int bytes_per_param;
  std::string traffic;
};

absl::Status RunOptimizers(uint64_t n, const std::vector<int>& thread_counts, double seconds,
                           const std::vector<CopyRate>& memcpy_rates) {
  OptimizerConfig sgd_momentum = OptimizerConfig::Sgd(1e-3);
  sgd_momentum.momentum = 0.9;
  const std::vector<OptimizerCase> cases = {
      {"adamw", OptimizerConfig::AdamW(), 28, "r p,g,m,v; w p,m,v"},
      {"sgd-momentum", sgd_momentum, 20, "r p,g,buf; w p,buf"},
      {"adagrad", OptimizerConfig::Adagrad(), 20, "r p,g,sum; w p,sum"},
      {"lion", OptimizerConfig::Lion(), 20, "r p,g,m; w p,m"},
      // Whole tensors (1024 x 1024 matrices, one per task): two passes, the
      // second after the tensor's norms.
      {"lamb (whole tensors)", OptimizerConfig::Lamb(), 40, "r p,g,m,v; w m,v; r p,m,v; w p"},
      // Four passes over g or p; the factored state is negligible.
      {"adafactor (whole tensors)", OptimizerConfig::Adafactor(), 24, "r p; r g; r g; r p,g; w p"},
      {"sgd (plain, as in b)", BenchSgd(), 12, "r p,g; w p"},
  };
  std::vector<float> params(n), grads(n);
  FillParams(params);
  FillGradients(grads);
  Table table({"optimizer", "threads", "B/param", "traffic", "ms/update", "Mparams/s", "GB/s",
               "memcpy GB/s", "frac of memcpy"});
  // The whole-tensor optimizers see the buffer as 1024 x 1024 matrices (and
  // a vector of the rest).
  constexpr uint64_t kSide = 1024;
  std::vector<RangeTensor> matrices;
  for (uint64_t at = 0; at < n; at += kSide * kSide) {
    const uint64_t size = std::min(kSide * kSide, n - at);
    matrices.push_back(size == kSide * kSide
                           ? RangeTensor{at, size, {int64_t{kSide}, int64_t{kSide}}}
                           : RangeTensor{at, size, {static_cast<int64_t>(size)}});
  }
  for (const OptimizerCase& c : cases) {
    const bool whole = NeedsWholeTensors(c.config.kind);
    absl::StatusOr<std::unique_ptr<Optimizer>> opt =
        Optimizer::Create(c.config, n, whole ? matrices : std::vector<RangeTensor>());
    if (!opt.ok()) return opt.status();
    int64_t step = 0;
    for (size_t k = 0; k < thread_counts.size(); ++k) {
      const int t = thread_counts[k];
      ThreadPool pool(t);
      std::vector<double> times = TimeRepeated(seconds, 3, 100000, [&] {
        ++step;
        if (whole) {
          pool.ParallelFor(matrices.size(), 1, [&](size_t begin, size_t end) {
            for (size_t m = begin; m < end; ++m) {
              (*opt)->UpdateTensor(step, params.data(), grads.data(), m);
            }
          });
          return;
        }
        pool.ParallelFor(n, CpuBackend::kGrainElements, [&](size_t begin, size_t end) {
          (*opt)->Update(step, params.data(), grads.data(), begin, end);
        });
      });
      const double s = Median(times);
      const double gbps = static_cast<double>(c.bytes_per_param) * n / s / 1e9;
      std::string mem = "n/a", frac = "n/a";
      for (const CopyRate& r : memcpy_rates) {
        if (r.threads == t) {
          mem = Fixed(r.gbps, 2);
          frac = Fixed(gbps / r.gbps, 2);
        }
      }
      table.AddRow({c.name, absl::StrCat(t), absl::StrCat(c.bytes_per_param), c.traffic,
                    Fixed(s * 1e3, 2), Fixed(n / s / 1e6, 0), Fixed(gbps, 2), mem, frac});
    }
  }
  for (float p : params) {
    if (!std::isfinite(p)) return absl::InternalError("optimizer produced a non-finite value");
  }
  table.Print();
  return absl::OkStatus();
}

// LAMB through the shard's backend, the way a server runs it: 64 matrices
// of 1024 x 1024 updated whole on one shard (CpuBackend::Update: measure
// and update in 64K-element parts over the threads), against the same
// matrices on the flat partition of 3 shards, whose steps gather the
// tensor norms from every shard (each shard's MeasureTrust, the trainers'
// CombineTrustPartials, each shard's UpdateWithTrust; the 3 shards run one
// after another on the same threads, so the row is their total work).
absl::Status RunLambBackends(uint64_t n, const std::vector<int>& thread_counts, double seconds,
                             const std::vector<CopyRate>& memcpy_rates) {
  constexpr int64_t kSide = 1024;
  constexpr uint32_t kShards = 3;
  std::vector<TensorSpec> specs;
  for (uint64_t m = 0; m < n / (kSide * kSide); ++m) {
    specs.push_back(TensorSpec{absl::StrCat("w", m), {kSide, kSide}, DType::kFloat32});
  }
  if (const int64_t rest = static_cast<int64_t>(n % (kSide * kSide)); rest > 0) {
    specs.push_back(TensorSpec{"rest", {rest}, DType::kFloat32});
  }
  const OptimizerConfig lamb = OptimizerConfig::Lamb();
  Table table({"lamb through CpuBackend", "threads", "ms/update", "Mparams/s", "GB/s (40 B)",
               "frac of memcpy"});
  for (int t : thread_counts) {
    ThreadPool pool(t);
    for (const uint32_t shards : {1u, kShards}) {
      absl::StatusOr<ModelLayout> layout = ModelLayout::Create(
          specs, 64, shards, shards == 1 ? Partition::kWholeTensors : Partition::kFlat);
      if (!layout.ok()) return layout.status();
      std::vector<std::unique_ptr<CpuBackend>> backends;
      for (uint32_t s = 0; s < shards; ++s) {
        std::vector<float> params(layout->ShardSize(s)), grads(layout->ShardSize(s));
        FillParams(params);
        FillGradients(grads);
        absl::StatusOr<std::unique_ptr<CpuBackend>> b =
            CpuBackend::Create(lamb, 1, std::move(params), &pool, TensorPiecesOfShard(*layout, s));
        if (!b.ok()) return b.status();
        absl::StatusOr<size_t> staged =
            (*b)->Stage(0, 0, grads.data(), DType::kFloat32, grads.size());
        if (!staged.ok()) return staged.status();
        if (absl::Status r = (*b)->Reduce(true); !r.ok()) return r;
        backends.push_back(*std::move(b));
      }
      int64_t step = 0;
      absl::Status failed;
      std::vector<double> times = TimeRepeated(seconds, 3, 100000, [&] {
        ++step;
        if (shards == 1) {
          failed.Update(backends[0]->Update(step, lamb, 1.0f));
          return;
        }
        std::vector<StepStats> stats(shards);
        for (uint32_t s = 0; s < shards; ++s) {
          absl::StatusOr<std::vector<TrustPartial>> p = backends[s]->MeasureTrust(step, lamb, 1.0f);
          if (!p.ok()) return failed.Update(p.status());
          stats[s].trust_partials = *std::move(p);
        }
        absl::StatusOr<std::vector<TensorNorms>> norms = CombineTrustPartials(stats, *layout);
        if (!norms.ok()) return failed.Update(norms.status());
        for (uint32_t s = 0; s < shards; ++s) {
          failed.Update(backends[s]->UpdateWithTrust(step, lamb, 1.0f, *norms));
        }
      });
      if (!failed.ok()) return failed;
      const double sec = Median(times);
      const double gbps = 40.0 * n / sec / 1e9;
      std::string frac = "n/a";
      for (const CopyRate& r : memcpy_rates) {
        if (r.threads == t) frac = Fixed(gbps / r.gbps, 2);
      }
      table.AddRow({shards == 1 ? "whole tensors, 1 shard"
                                : absl::StrCat("flat, ", kShards, " shards, norms gathered"),
                    absl::StrCat(t), Fixed(sec * 1e3, 2), Fixed(n / sec / 1e6, 0), Fixed(gbps, 2),
                    frac});
    }
  }
  table.Print();
  return absl::OkStatus();
}

// Muon is bound by its matrix products, not by memory: its update of the
// `params` parameters as matrices of kSide^2 (one per task, each product
// on one BLAS thread; at least one) against the BLAS's own sgemm of that
// shape on as many threads, in FLOP/s.
absl::Status RunMuon(uint64_t params_wanted, const std::vector<int>& thread_counts,
                     double seconds) {
  constexpr size_t kSide = 1024;
  const size_t kMatrices = std::max<size_t>(1, params_wanted / (kSide * kSide));
  const OptimizerConfig muon = OptimizerConfig::Muon();
  const size_t n = kSide * kSide * kMatrices;
  std::vector<RangeTensor> matrices;
  for (size_t m = 0; m < kMatrices; ++m) {
    matrices.push_back(
        RangeTensor{m * kSide * kSide, kSide * kSide, {int64_t{kSide}, int64_t{kSide}}});
  }
  absl::StatusOr<std::unique_ptr<Optimizer>> opt = Optimizer::Create(muon, n, matrices);
  if (!opt.ok()) return opt.status();
  std::vector<float> params(n), grads(n);
  FillParams(params);
  FillGradients(grads);
  // Per matrix and Newton-Schulz step: X X^T, S S and P X (2 k m n each).
  const double side = static_cast<double>(kSide);
  const double flops = kMatrices * muon.ns_steps * 3 * 2 * side * side * side;
  std::vector<float> a(kSide * kSide, 0.5f), b(kSide * kSide, 0.25f);
  std::vector<std::vector<float>> c(kMatrices, std::vector<float>(kSide * kSide));
  Table table({"work", "threads", "ms", "GFLOP/s", "of sgemm's"});
  int64_t step = 0;
  for (int t : thread_counts) {
    ThreadPool pool(t);
    const double gemm_s = Median(TimeRepeated(seconds, 3, 100000, [&] {
      pool.ParallelFor(kMatrices, 1, [&](size_t begin, size_t end) {
        for (size_t m = begin; m < end; ++m) {
          blas::Sgemm(false, false, kSide, kSide, kSide, 1.0f, a.data(), kSide, b.data(), kSide,
                      0.0f, c[m].data(), kSide);
        }
      });
    }));
    const double gemm_gflops = kMatrices * 2 * side * side * side / gemm_s / 1e9;
    const double muon_s = Median(TimeRepeated(seconds, 3, 100000, [&] {
      ++step;
      pool.ParallelFor(kMatrices, 1, [&](size_t begin, size_t end) {
        for (size_t m = begin; m < end; ++m) {
          (*opt)->UpdateTensor(step, params.data(), grads.data(), m);
        }
      });
    }));
    const double muon_gflops = flops / muon_s / 1e9;
    table.AddRow({absl::StrCat(kMatrices, " sgemm ", kSide, "^3"), absl::StrCat(t),
                  Fixed(gemm_s * 1e3, 2), Fixed(gemm_gflops, 1), "1.00"});
    table.AddRow({absl::StrCat("muon update, ", kMatrices, " x ", kSide, "x", kSide),
                  absl::StrCat(t), Fixed(muon_s * 1e3, 2), Fixed(muon_gflops, 1),
                  Fixed(muon_gflops / gemm_gflops, 2)});
  }
  for (float p : params) {
    if (!std::isfinite(p)) return absl::InternalError("muon produced a non-finite value");
  }
  absl::PrintF(
      "\n  Muon: %d Newton-Schulz steps of 3 products per matrix (FLOPs counted as 2mnk)\n",
      muon.ns_steps);
  table.Print();
  return absl::OkStatus();
}

}  // namespace

absl::Status RunOptimizerSection(uint64_t params, int64_t memcpy_mib,
                                 const std::vector<int>& thread_counts, double seconds) {
  const size_t copy_bytes = static_cast<size_t>(memcpy_mib) * kMiB;
  absl::PrintF(
      "\n(c) CPU optimizer update rate, %lld parameters, Update split over a ThreadPool\n"
      "  (median per update); memcpy reference: %lld MiB buffer, read+write bytes\n",
      static_cast<long long>(params), static_cast<long long>(memcpy_mib));
  std::fflush(stdout);
  std::vector<CopyRate> copies = RunMemcpy(copy_bytes, thread_counts, seconds);
  Table copy_table({"memcpy", "threads", "ms/copy", "GB/s (r+w)"});
  for (const CopyRate& c : copies) {
    copy_table.AddRow({absl::StrCat(memcpy_mib, " MiB"), absl::StrCat(c.threads),
                       Fixed(c.seconds * 1e3, 2), Fixed(c.gbps, 2)});
  }
  copy_table.Print();
  absl::PrintF("\n");
  if (absl::Status s = RunOptimizers(params, thread_counts, seconds, copies); !s.ok()) return s;
  absl::PrintF("\n");
  if (absl::Status s = RunLambBackends(params, thread_counts, seconds, copies); !s.ok()) return s;
  return RunMuon(params, thread_counts, seconds);
}

}  // namespace shardopt::bench
