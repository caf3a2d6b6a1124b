#include "server/cuda/fused_test_util.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/float_bits.h"

namespace shardopt {
namespace gpu {
namespace testing {
namespace {

uint64_t SplitMix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

float RandomValue(uint64_t& s, bool gradient) {
  static constexpr float kScales[8] = {1e-4f, 1e-3f, 1e-2f, 1e-1f, 1.0f, 3.0f, 10.0f, 0.5f};
  const uint64_t u = SplitMix64(s);
  const float unit = static_cast<float>((u >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
  const unsigned sel = static_cast<unsigned>(u % 100);
  if (sel < 3) return (u & (1ull << 32)) ? -0.0f : 0.0f;
  if (gradient) {
    if (sel < 5) return std::ldexp(unit, -130 + static_cast<int>((u >> 33) % 20));  // tiny
    if (sel < 8) return unit * 1000.0f;
  }
  return unit * kScales[(u >> 36) & 7];
}

double Bf16Value(uint16_t b) {
  // 0x7f80 / 0xff80 stand for +-2^128 here: the value past the largest
  // finite bf16 that rounding compares against.
  if ((b & 0x7fffu) == 0x7f80u) {
    return (b & 0x8000u) ? -std::ldexp(1.0, 128) : std::ldexp(1.0, 128);
  }
  return static_cast<double>(FromBits(static_cast<uint32_t>(b) << 16));
}

}  // namespace

uint32_t Bits(float x) { return FloatToBits(x); }
float FromBits(uint32_t u) { return BitsToFloat(u); }

void FillRandom(std::vector<float>& v, uint64_t seed, bool gradient) {
  constexpr size_t kChunk = size_t{1} << 16;
  const size_t chunks = (v.size() + kChunk - 1) / kChunk;
  auto fill_chunks = [&](size_t first, size_t step) {
    for (size_t c = first; c < chunks; c += step) {
      uint64_t s = seed * 0x100000001b3ull + c;
      const size_t end = std::min(v.size(), (c + 1) * kChunk);
      for (size_t i = c * kChunk; i < end; ++i) v[i] = RandomValue(s, gradient);
    }
  };
  const size_t cpus = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  const size_t threads = std::min(chunks, cpus);
  if (threads <= 1) {
    fill_chunks(0, 1);
    return;
  }
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t) pool.emplace_back(fill_chunks, t, threads);
  for (std::thread& t : pool) t.join();
}

std::vector<uint32_t> SpecialBits() {
  return {
      0x00000000u, 0x80000000u,                            // +-0
      0x00000001u, 0x80000001u, 0x00008000u, 0x00018000u,  // subnormals, ties
      0x007fffffu, 0x00800000u, 0x80800000u,               // largest subnormal, FLT_MIN
      0x3f800000u, 0xbf800000u,                            // +-1
      0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu,  // ties to even, around ties
      0xbf808000u, 0xbf818000u,                            // negative ties
      0x7f7f7fffu, 0x7f7f8000u, 0x7f7fffffu, 0xff7fffffu,  // near the top: max or inf
      0x7f7effffu, 0x7f7f0000u,                            //
      0x7f800000u, 0xff800000u,                            // +-inf
      0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u,  // NaNs (quiet, signalling)
      0x7fffffffu, 0xffffffffu, 0x7fa5a5a5u, 0x7f810000u,  //
  };
}

std::vector<uint32_t> RandomBits(size_t count, uint64_t seed) {
  std::vector<uint32_t> v(count);
  uint64_t s = seed;
  for (uint32_t& x : v) {
    const uint64_t u = SplitMix64(s);
    x = static_cast<uint32_t>(u);
    if ((u >> 32) % 4 == 0) {
      x = (x & 0xffff0000u) | (0x7fffu + static_cast<uint32_t>((u >> 40) % 3));
    }
  }
  return v;
}

uint16_t ReferenceBf16(float x) {
  const uint16_t lo = static_cast<uint16_t>(Bits(x) >> 16);  // toward zero
  if (std::isinf(x) || (Bits(x) & 0xffffu) == 0) return lo;
  const uint16_t hi = static_cast<uint16_t>(lo + 1);  // next away from zero
  const double d_lo = std::fabs(static_cast<double>(x) - Bf16Value(lo));
  const double d_hi = std::fabs(Bf16Value(hi) - static_cast<double>(x));
  if (d_lo < d_hi) return lo;
  if (d_hi < d_lo) return hi;
  return (lo & 1u) ? hi : lo;
}

::testing::AssertionResult Bf16Matches(float x, uint16_t got) {
  if (std::isnan(x)) {
    const uint16_t want = static_cast<uint16_t>((Bits(x) >> 16) | 0x40u);
    if (got == want) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << absl::StrFormat("NaN 0x%08x -> 0x%04x, want 0x%04x", Bits(x), got, want);
  }
  const uint16_t want = ReferenceBf16(x);
  if (got == want) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << absl::StrFormat("%a (0x%08x) -> 0x%04x, want 0x%04x", x, Bits(x), got, want);
}

size_t CountBf16Mismatches(const float* x, const uint16_t* got, size_t n, int report) {
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const ::testing::AssertionResult r = Bf16Matches(x[i], got[i]);
    if (!r && static_cast<int>(bad++) < report) {
      ADD_FAILURE() << "bf16 element " << i << ": " << r.message();
    }
  }
  return bad;
}

::testing::AssertionResult SameFloats(const std::string& what, const float* want, const float* got,
                                      size_t n) {
  size_t bad = 0;
  size_t first = 0;
  for (size_t i = 0; i < n; ++i) {
    const bool same = Bits(want[i]) == Bits(got[i]) || (std::isnan(want[i]) && std::isnan(got[i]));
    if (!same && bad++ == 0) first = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << absl::StrFormat(
             "%s: %d of %d elements differ; first at %d: cpu %a (0x%08x), gpu %a (0x%08x)", what,
             bad, n, first, want[first], Bits(want[first]), got[first], Bits(got[first]));
}

void PrintTo(const NamedConfig& c, std::ostream* os) {
  *os << c.name << ": " << c.config.DebugString();
}

std::vector<NamedConfig> ParityConfigs() {
  std::vector<NamedConfig> v;
  auto add = [&](std::string name, OptimizerConfig c) { v.push_back({std::move(name), c}); };
  add("sgd", OptimizerConfig::Sgd(0.1));
  OptimizerConfig c = OptimizerConfig::Sgd(0.05);
  c.weight_decay = 0.01;
  c.maximize = true;
  add("sgd_wd_maximize", c);
  c = OptimizerConfig::Sgd(0.1);
  c.momentum = 0.9;
  add("sgd_momentum", c);
  c = OptimizerConfig::Sgd(0.1);
  c.momentum = 0.8;
  c.dampening = 0.1;
  c.weight_decay = 1e-4;
  add("sgd_momentum_dampening_wd", c);
  c = OptimizerConfig::Sgd(0.02);
  c.momentum = 0.9;
  c.nesterov = true;
  c.weight_decay = 1e-2;
  c.maximize = true;
  add("sgd_nesterov_wd_maximize", c);

  add("adam", OptimizerConfig::Adam(1e-3));
  c = OptimizerConfig::Adam(2e-3);
  c.weight_decay = 0.01;
  c.amsgrad = true;
  add("adam_wd_amsgrad", c);
  c = OptimizerConfig::Adam(1e-2);
  c.maximize = true;
  c.eps = 1e-6;
  c.beta1 = 0.8;
  c.beta2 = 0.99;
  add("adam_maximize_betas", c);
  add("adamw", OptimizerConfig::AdamW(1e-3));
  c = OptimizerConfig::AdamW(1e-2);
  c.weight_decay = 0.1;
  c.amsgrad = true;
  c.maximize = true;
  add("adamw_amsgrad_maximize", c);
  c = OptimizerConfig::AdamW(1e-3);
  c.weight_decay = 0.0;  // decay == 1: no decoupled multiply, as on the CPU
  add("adamw_no_decay", c);

  add("adagrad", OptimizerConfig::Adagrad(1e-2));
  c = OptimizerConfig::Adagrad(5e-2);
  c.lr_decay = 0.01;
  c.weight_decay = 1e-3;
  c.initial_accumulator_value = 0.1;
  c.maximize = true;
  add("adagrad_lrdecay_wd_init_maximize", c);
  add("lion", OptimizerConfig::Lion(1e-3));
  c = OptimizerConfig::Lion(3e-3);
  c.weight_decay = 0.1;
  c.maximize = true;
  c.beta1 = 0.8;
  add("lion_wd_maximize_betas", c);
  return v;
}

}  // namespace testing
}  // namespace gpu
}  // namespace shardopt
