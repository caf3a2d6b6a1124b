// The staged sums (lane_squares_body.h: a warp's 32 runs read chunk by chunk
// through a tile, run here lane after lane as the emulation runs them)
// against LaneSquaresOf, the one-thread order the CPU kernels use, bit for
// bit: runs of every length around the lanes, the chunks and the pieces,
// mixed within one warp so that lanes finish in different chunks, empty runs
// included, and more runs than one warp takes.
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "server/cuda/lane_squares_body.h"

namespace shardopt {
namespace gpu {
namespace {

namespace body = internal::body;

// Run r is values[starts[r], starts[r] + counts[r]); its sum goes to sums[r].
struct RunsJob {
  static constexpr int kValues = 2;
  static constexpr int kBatch = 8;
  struct Raw {
    float x;
  };
  const float* values;
  const uint64_t* starts;
  const uint64_t* counts;
  size_t num_runs;
  double* sums;       // The squares of x.
  double* negated;    // The squares of -2x (a second value per element).

  size_t runs() const { return num_runs; }
  void Describe(size_t r, body::StagedRun& run) const {
    run.start = starts[r];
    run.count = counts[r];
  }
  void Load(const body::StagedRun& run, size_t k, Raw& raw) const {
    raw.x = values[run.start + k];
  }
  void Values(const Raw& raw, float (&v)[2]) const {
    v[0] = raw.x;
    v[1] = -2.0f * raw.x;
  }
  void Write(size_t r, const double (&s)[2]) const {
    sums[r] = s[0];
    negated[r] = s[1];
  }
};

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof(double)) == 0; }

void ExpectStagedMatchesOneThread(const std::vector<uint64_t>& counts, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(-3.0f, 3.0f);
  std::vector<uint64_t> starts;
  uint64_t total = 0;
  for (uint64_t c : counts) {
    starts.push_back(total);
    total += c + 3;  // Gaps: a run must not read its neighbour's elements.
  }
  std::vector<float> values(total + 1);
  for (float& v : values) v = value(rng);
  std::vector<double> sums(counts.size(), -1.0), negated(counts.size(), -1.0);
  body::RunStagedSquaresOnHost(RunsJob{values.data(), starts.data(), counts.data(), counts.size(),
                                       sums.data(), negated.data()});
  for (size_t r = 0; r < counts.size(); ++r) {
    const float* x = values.data() + starts[r];
    const double expected = body::LaneSquaresOf(counts[r], [x](size_t i) { return x[i]; });
    const double expected_negated =
        body::LaneSquaresOf(counts[r], [x](size_t i) { return -2.0f * x[i]; });
    EXPECT_TRUE(SameBits(sums[r], expected))
        << "run " << r << " of " << counts[r] << ": " << sums[r] << " vs " << expected;
    EXPECT_TRUE(SameBits(negated[r], expected_negated))
        << "run " << r << " of " << counts[r] << " (second value)";
  }
}

TEST(LaneSquaresTest, EveryLengthAroundLanesChunksAndPieces) {
  std::vector<uint64_t> counts;
  for (uint64_t c = 0; c <= 70; ++c) counts.push_back(c);
  for (uint64_t c : {95, 96, 97, 255, 256, 257, 2047, 2048, 2049, 5000}) counts.push_back(c);
  ExpectStagedMatchesOneThread(counts, 1);
}

TEST(LaneSquaresTest, MixedLengthsInOneWarpAndManyWarps) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint64_t> length(0, 300);
  std::vector<uint64_t> counts(32 * 5 + 11);
  for (uint64_t& c : counts) c = length(rng);
  counts[3] = 0;
  counts[40] = 4096;
  ExpectStagedMatchesOneThread(counts, 2);
}

TEST(LaneSquaresTest, AWarpOfEmptyRunsWritesZeros) {
  ExpectStagedMatchesOneThread(std::vector<uint64_t>(40, 0), 3);
}

}  // namespace
}  // namespace gpu
}  // namespace shardopt
