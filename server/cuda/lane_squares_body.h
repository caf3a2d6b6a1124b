// Internal to //server/cuda: SumOfSquares (server/optim/optimizer_internal.h)
// for the kernels, in double with the CPU's bits, and the warp-staged way of
// computing it over many runs that the GPU can read coalesced.
//
// SumOfSquares of x[0..n): eight lanes over the whole groups of eight (lane
// j takes x[j], x[j + 8], ... in order), the lanes added in order, then the
// rest one by one. Each lane is a chain of dependent double adds, so the
// order cannot be parallelised within a run; what can be changed is how the
// run is read. One thread walking its own run of consecutive elements reads
// memory uncoalesced (neighbouring threads 256 B or more apart): on the
// first H200 run that held LAMB's measure pass at 5 % of the copy rate.
//
// StagedSquares: a warp takes 32 runs, one per lane. Chunk by chunk (32
// elements of every run), the whole warp reads the chunk of each run in
// turn, lane i element i (coalesced), computes the values to square
// (Job::Values, which may read several arrays) and writes them into a
// shared tile; then each lane adds its own run's row of the tile to its
// lane sums (LaneSum), in SumOfSquares' order. The work is in three
// phases per lane (Begin, Stage, Consume) with a warp barrier between
// them, so the same code runs on the device (staged_squares_kernel.h) and, lane
// after lane, on the host (RunStagedSquaresOnHost, for the emulation tests).
//
// A Job (trivially copyable, its methods SHARDOPT_KERNEL_FN) has:
//   static constexpr int kValues;               // sums per run (1 or 2)
//   static constexpr int kBatch;                // runs staged at a time
//   struct Raw;                                 // what an element reads
//   size_t runs() const;
//   void Describe(size_t run, StagedRun& r) const;  // start, count, row, batch
//   void Load(const StagedRun& r, size_t k, Raw& raw) const;  // k < r.count
//   void Values(const Raw& raw, float (&v)[kValues]) const;   // no loads
//   void Write(size_t run, const double (&sums)[kValues]) const;
// Load and Values are apart so that a batch's loads are all issued before
// any arithmetic: IEEE division and square root have branches that the
// compiler does not move loads across (on the H200, LAMB's measure pass
// read at 19 % of the copy rate with them interleaved).
#ifndef SHARDOPT_SERVER_CUDA_LANE_SQUARES_BODY_H_
#define SHARDOPT_SERVER_CUDA_LANE_SQUARES_BODY_H_

#include <cstddef>
#include <cstdint>

#include "server/cuda/fused_kernel_body.h"

namespace shardopt {
namespace gpu {
namespace internal {
namespace body {

SHARDOPT_KERNEL_FN double AddD(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

SHARDOPT_KERNEL_FN double SquareD(float x) {
  const double d = static_cast<double>(x);
#if defined(__CUDA_ARCH__)
  return __dmul_rn(d, d);
#else
  return d * d;
#endif
}

// SumOfSquares of value(0), ..., value(n - 1), read by one thread: the order
// written out plainly, which lane_squares_test holds the staged sums to.
template <typename Value>
SHARDOPT_KERNEL_FN double LaneSquaresOf(size_t n, const Value& value) {
  double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    SHARDOPT_UNROLL
    for (size_t j = 0; j < 8; ++j) lanes[j] = AddD(lanes[j], SquareD(value(i + j)));
  }
  double sum = 0;
  SHARDOPT_UNROLL
  for (size_t j = 0; j < 8; ++j) sum = AddD(sum, lanes[j]);
  for (; i < n; ++i) sum = AddD(sum, SquareD(value(i)));
  return sum;
}

inline constexpr int kStagedRuns = 32;      // Runs per warp: one per lane.
inline constexpr int kStagedChunk = 32;     // Elements of each run per chunk.
inline constexpr int kStagedRowStride = 33; // Padded: lane i reads row i conflict-free.

// One run of a warp: its elements are Values(r, 0 .. count - 1); start, row
// and batch are the job's to use.
struct StagedRun {
  uint64_t start;
  uint64_t count;
  uint64_t row;
  uint64_t batch;
};

template <int kValues>
struct StagedTile {
  StagedRun runs[kStagedRuns];
  float values[kValues][kStagedRuns][kStagedRowStride];
};

// LaneSquaresOf fed a chunk at a time: Add the chunks of a run of `count`
// elements in order (each starting at a multiple of kStagedChunk), then
// Finish with the chunk that holds the last element.
struct LaneSum {
  double lanes[8];

  SHARDOPT_KERNEL_FN void Clear() {
    SHARDOPT_UNROLL
    for (int j = 0; j < 8; ++j) lanes[j] = 0;
  }
  // row[i] is element first + i; only the elements in whole groups of eight
  // count here (unrolled, so that lanes[] stays in registers).
  SHARDOPT_KERNEL_FN void Add(const float* row, uint64_t first, uint64_t count) {
    const uint64_t whole = count / 8 * 8;
    SHARDOPT_UNROLL
    for (int i = 0; i < kStagedChunk; ++i) {
      if (first + i < whole) lanes[i % 8] = AddD(lanes[i % 8], SquareD(row[i]));
    }
  }
  // The lanes in order, then the elements past the last whole group (all in
  // this chunk: `first` is a multiple of eight and at most count - 1).
  SHARDOPT_KERNEL_FN double Finish(const float* row, uint64_t first, uint64_t count) const {
    double sum = 0;
    SHARDOPT_UNROLL
    for (int j = 0; j < 8; ++j) sum = AddD(sum, lanes[j]);
    for (uint64_t k = count / 8 * 8; k < count; ++k) sum = AddD(sum, SquareD(row[k - first]));
    return sum;
  }
};

// Phase 1, lane `lane` of the warp whose runs start at `first_run`:
// describes its run in the tile and clears its sums (a run of no elements
// is written as zero at once).
template <typename Job>
SHARDOPT_KERNEL_FN void StagedBegin(const Job& job, size_t first_run, int lane,
                                    StagedTile<Job::kValues>& tile,
                                    LaneSum (&sums)[Job::kValues]) {
  StagedRun& r = tile.runs[lane];
  r.start = r.count = r.row = r.batch = 0;
  const size_t run = first_run + static_cast<size_t>(lane);
  for (int v = 0; v < Job::kValues; ++v) sums[v].Clear();
  if (run >= job.runs()) return;
  job.Describe(run, r);
  if (r.count == 0) {
    double zeros[Job::kValues] = {};
    job.Write(run, zeros);
  }
}

// The chunks the warp walks: its longest run's.
template <int kValues>
SHARDOPT_KERNEL_FN uint64_t StagedChunks(const StagedTile<kValues>& tile) {
  uint64_t longest = 0;
  for (int r = 0; r < kStagedRuns; ++r) {
    if (tile.runs[r].count > longest) longest = tile.runs[r].count;
  }
  return (longest + kStagedChunk - 1) / kStagedChunk;
}

// Phase 2: lane `lane` computes element chunk * 32 + lane of every run,
// Job::kBatch runs at a time: every load of the batch, then the values,
// then the stores (a store into the tile between two loads would also keep
// the next load waiting for the one before: the compiler cannot tell that
// the tile is not the loads' memory; seen on the H200, 8 % of the copy rate).
template <typename Job>
SHARDOPT_KERNEL_FN void StagedStage(const Job& job, uint64_t chunk, int lane,
                                    StagedTile<Job::kValues>& tile) {
  static_assert(kStagedRuns % Job::kBatch == 0, "whole batches");
  const uint64_t k = chunk * kStagedChunk + static_cast<uint64_t>(lane);
  for (int r0 = 0; r0 < kStagedRuns; r0 += Job::kBatch) {
    typename Job::Raw raw[Job::kBatch];
    SHARDOPT_UNROLL
    for (int r = 0; r < Job::kBatch; ++r) {
      const StagedRun& run = tile.runs[r0 + r];
      if (k < run.count) job.Load(run, k, raw[r]);
    }
    SHARDOPT_UNROLL
    for (int r = 0; r < Job::kBatch; ++r) {
      if (k >= tile.runs[r0 + r].count) continue;
      float values[Job::kValues];
      job.Values(raw[r], values);
      SHARDOPT_UNROLL
      for (int v = 0; v < Job::kValues; ++v) tile.values[v][r0 + r][lane] = values[v];
    }
  }
}

// Phase 3: lane `lane` adds its run's row of the chunk, and writes the
// sums after the chunk that holds its last element.
template <typename Job>
SHARDOPT_KERNEL_FN void StagedConsume(const Job& job, size_t first_run, uint64_t chunk, int lane,
                                      const StagedTile<Job::kValues>& tile,
                                      LaneSum (&sums)[Job::kValues]) {
  const uint64_t count = tile.runs[lane].count;
  const uint64_t first = chunk * kStagedChunk;
  if (first >= count) return;
  for (int v = 0; v < Job::kValues; ++v) sums[v].Add(tile.values[v][lane], first, count);
  if (first + kStagedChunk < count) return;
  double out[Job::kValues];
  for (int v = 0; v < Job::kValues; ++v) out[v] = sums[v].Finish(tile.values[v][lane], first, count);
  job.Write(first_run + static_cast<size_t>(lane), out);
}

#if !defined(__CUDA_ARCH__)
// The device's warps run one after another, each lane after another
// between the barriers.
template <typename Job>
void RunStagedSquaresOnHost(const Job& job) {
  StagedTile<Job::kValues> tile;
  for (size_t first = 0; first < job.runs(); first += kStagedRuns) {
    LaneSum sums[kStagedRuns][Job::kValues];
    for (int lane = 0; lane < kStagedRuns; ++lane) StagedBegin(job, first, lane, tile, sums[lane]);
    const uint64_t chunks = StagedChunks(tile);
    for (uint64_t chunk = 0; chunk < chunks; ++chunk) {
      for (int lane = 0; lane < kStagedRuns; ++lane) StagedStage(job, chunk, lane, tile);
      for (int lane = 0; lane < kStagedRuns; ++lane) {
        StagedConsume(job, first, chunk, lane, tile, sums[lane]);
      }
    }
  }
}
#endif

}  // namespace body
}  // namespace internal
}  // namespace gpu
}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CUDA_LANE_SQUARES_BODY_H_
