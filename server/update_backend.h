// UpdateBackend: where one model shard's numbers live and are updated.
//
// ModelShard runs the step protocol (versions, trainer slots, locking) and
// delegates the data to a backend: the fp32 master parameters of the range,
// the optimizer slots, and one staging buffer per trainer. The CPU backend
// keeps them in host memory and updates on a thread pool; a GPU backend keeps
// them in device memory. Both must produce the same bits.
//
// Threading contract (ModelShard guarantees it):
// - Stage(rank, ...) for one rank is called by one thread at a time, with
//   consecutive chunks; different ranks may stage concurrently.
// - FinishStaging(rank) is called once a rank's whole range has been staged;
//   when it returns, the data must be where Apply() reads it.
// - Apply() runs only when every rank has finished staging, and never
//   concurrently with Stage, Read or another Apply.
// - Read(), ReadBFloat16() and ReadSlot() may run concurrently with other
//   reads (not with Apply). WriteSlot() runs only before the shard takes its first push.
#ifndef SHARDOPT_SERVER_UPDATE_BACKEND_H_
#define SHARDOPT_SERVER_UPDATE_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/device_pair.h"
#include "common/dtype.h"
#include "common/layout.h"
#include "common/optimizer_config.h"
#include "common/step_protocol.h"

namespace shardopt {

class UpdateBackend {
 public:
  virtual ~UpdateBackend() = default;

  // "cpu", "cuda:0", ...
  virtual std::string device() const = 0;

  // Converts `count` elements of `dtype` from `data` (any alignment) to fp32
  // into rank's staging buffer at range-local `offset`. Returns the index
  // (relative to `data`) of the first NaN/inf, or `count` when all are
  // finite; nothing staged by a push that saw one is ever applied.
  virtual absl::StatusOr<size_t> Stage(uint32_t rank, uint64_t offset, const void* data,
                                       DType dtype, size_t count) = 0;
  // Rank's staging at range-local [offset, offset + count), where it lies in
  // this process's memory, so that a push's fp32 elements can be received
  // straight into it (ModelShard::PushWriter::ReceiveInPlace checks them
  // there, as Stage would); nullptr where it does not (a device's memory) or
  // for a span outside the range.
  virtual float* HostStaging(uint32_t rank, uint64_t offset, uint64_t count) {
    (void)rank, (void)offset, (void)count;
    return nullptr;
  }
  virtual absl::Status FinishStaging(uint32_t rank) = 0;

  // The device data plane (server/shard_service_device_pair.cc) receives
  // fp32 pushes straight into the staging and sends pulls from the memory
  // the backend keeps its numbers in: host memory for the CPU backend, the
  // GPU's for a GPU backend. The defaults serve backends whose staging is
  // HostStaging.
  virtual PairMemory own_memory() const { return PairMemory::kHost; }
  // Rank's staging at range-local [offset, offset + count) in that memory;
  // nullptr for a span outside the range.
  virtual void* OwnStaging(uint32_t rank, uint64_t offset, uint64_t count) {
    return HostStaging(rank, offset, count);
  }
  // After elements were received there: the first NaN/inf among rank's
  // staging [offset, offset + count) (relative to offset; count when none),
  // and the first element of `must_be_zero` (range-local spans inside it)
  // holding anything but +0 or -0.
  struct StagedScan {
    uint64_t first_non_finite = 0;
    std::optional<uint64_t> first_nonzero;  // Range-local.
  };
  virtual absl::StatusOr<StagedScan> ScanStaged(uint32_t rank, uint64_t offset, uint64_t count,
                                                absl::Span<const FlatRange> must_be_zero);
  // Staged values back in host memory (a refusal's message quotes them).
  virtual absl::Status ReadStaged(uint32_t rank, uint64_t offset, uint64_t count, float* out);
  // Parameters [offset, offset + count) into `own_out`, in own_memory().
  virtual absl::Status ReadOwn(uint64_t offset, uint64_t count, float* own_out) {
    return Read(offset, count, own_out);
  }

  // Reduces the staging buffers in rank order (sum, then divided by the
  // number of trainers when `mean`) and applies optimizer step `step` with
  // hyperparameters `config` (the registered optimizer, possibly changed
  // since, with this step's lr).
  virtual absl::Status Apply(int64_t step, bool mean, const OptimizerConfig& config) = 0;

  // The same in parts, for steps that need a decision first (clipping, loss
  // scaling): Reduce() leaves the reduced gradient in place; SumOfSquares()
  // returns the sum of (g * scale)^2 over it in double, summed in fixed
  // blocks of kNormBlockElements in order (so the result depends on neither
  // threads nor timing); Update() applies step `step` to gradient
  // g * multiplier. UNIMPLEMENTED where a backend lacks them.
  static constexpr size_t kNormBlockElements = 1 << 16;
  virtual absl::Status Reduce(bool mean) = 0;
  virtual absl::StatusOr<double> SumOfSquares(float scale) = 0;
  virtual absl::Status Update(int64_t step, const OptimizerConfig& config, float multiplier) = 0;

  // The same on elements [begin, end) of the range alone (pipelined steps,
  // see StepState): the result of every element is the whole call's, so a
  // step applied range by range gives the same bits. SumOfSquaresBlocks
  // writes the sum of each norm block in [begin, end) (begin is a multiple
  // of kNormBlockElements) to `block_sums`, in order. Range work runs one
  // range at a time, never concurrently with Read of that range, while
  // Stage of later elements may go on. Backends without them keep
  // supports_ranges() false and get whole-range calls only.
  virtual bool supports_ranges() const { return false; }
  // ApplyOneRange is there (the asynchronous consistency modes need it).
  virtual bool supports_one_trainer_updates() const { return false; }
  virtual absl::Status ApplyRange(int64_t step, bool mean, const OptimizerConfig& config,
                                  uint64_t begin, uint64_t end) {
    return absl::UnimplementedError("range updates");
  }
  virtual absl::Status ReduceRange(bool mean, uint64_t begin, uint64_t end) {
    return absl::UnimplementedError("range updates");
  }
  virtual absl::Status SumOfSquaresBlocks(float scale, uint64_t begin, uint64_t end,
                                          double* block_sums) {
    return absl::UnimplementedError("range updates");
  }
  virtual absl::Status UpdateRange(int64_t step, const OptimizerConfig& config, float multiplier,
                                   uint64_t begin, uint64_t end) {
    return absl::UnimplementedError("range updates");
  }

  // LAMB on the flat partition (StepsNeedTrustNorms), after Reduce():
  // MeasureTrust returns the trust partials of every tensor piece of the
  // range, in layout order, for step `step` on gradient g * multiplier, and
  // changes nothing; UpdateWithTrust then applies that step given every
  // model tensor's norms (`norms`, indexed by layout tensor). Together they
  // give the bits of one shard updating whole tensors. UNIMPLEMENTED where a
  // backend lacks them (measures_trust() false).
  virtual bool measures_trust() const { return false; }
  virtual absl::StatusOr<std::vector<TrustPartial>> MeasureTrust(int64_t step,
                                                                 const OptimizerConfig& config,
                                                                 float multiplier) {
    return absl::UnimplementedError("trust norms");
  }
  virtual absl::Status UpdateWithTrust(int64_t step, const OptimizerConfig& config,
                                       float multiplier, absl::Span<const TensorNorms> norms) {
    return absl::UnimplementedError("trust norms");
  }

  // Asynchronous modes (server/async_state.h): optimizer step `step` on
  // trainer `rank`'s staged gradient alone, multiplied by `multiplier` (the
  // unscale of a loss-scaled push), no reduction and no averaging, on
  // elements [begin, end). Runs when that rank finished staging, never
  // concurrently with Stage of that rank or with reads of [begin, end).
  // UNIMPLEMENTED where a backend lacks it.
  virtual absl::Status ApplyOneRange(uint32_t rank, int64_t step, const OptimizerConfig& config,
                                     float multiplier, uint64_t begin, uint64_t end) {
    return absl::UnimplementedError("asynchronous updates");
  }

  // Copies parameters [offset, offset + count) of the range into `out`.
  virtual absl::Status Read(uint64_t offset, uint64_t count, float* out) = 0;
  // The same parameters where they lie in this process's memory (for
  // ModelShard::SendParametersInPlace); nullptr where they do not (a
  // device's memory) or outside the range. Stable for the backend's life.
  virtual const float* HostParameters(uint64_t offset, uint64_t count) const {
    (void)offset, (void)count;
    return nullptr;
  }

  // The same parameters as bf16 bit patterns (round to nearest even, as
  // FloatToBFloat16Bits; NaNs may keep payload bits) written to `out` (any
  // alignment), from a copy the backend keeps up to date itself; false when
  // the backend keeps none (the caller converts Read()'s fp32 values).
  virtual absl::StatusOr<bool> ReadBFloat16(uint64_t offset, uint64_t count, void* out) {
    return false;
  }

  // The optimizer state, for checkpoints: slot `slot` in
  // OptimizerConfig::StateSlotNames() order, elements [offset, offset +
  // count) of the range. OUT_OF_RANGE for a slot the optimizer lacks;
  // WriteSlot: INVALID_ARGUMENT, writing nothing, for values the state
  // cannot hold (anything but +0.0 where a packed slot stores nothing, see
  // OptimizerConfig::PacksSlot), which a restore reports as DATA_LOSS.
  virtual absl::Status ReadSlot(int slot, uint64_t offset, uint64_t count, float* out) = 0;
  virtual absl::Status WriteSlot(int slot, uint64_t offset, uint64_t count, const float* in) = 0;

  virtual uint64_t parameter_bytes() const = 0;
  virtual uint64_t optimizer_state_bytes() const = 0;
  virtual uint64_t staging_bytes() const = 0;
};

// OUT_OF_RANGE unless [offset, offset + count) lies within a range of `size`
// elements: "<what> [offset, end) are outside the range of <size>". Every
// backend's check of the elements a call names, so that a refusal reads the
// same whichever device the shard runs on.
inline absl::Status CheckElementsInRange(absl::string_view what, uint64_t offset, uint64_t count,
                                         uint64_t size) {
  if (offset > size || count > size - offset) {
    return absl::OutOfRangeError(absl::StrCat(what, " [", offset, ", ", offset + count,
                                              ") are outside the range of ", size));
  }
  return absl::OkStatus();
}
// The same for the elements [begin, end) a range call names.
inline absl::Status CheckRangeElements(uint64_t begin, uint64_t end, uint64_t size) {
  if (begin > end) {
    return absl::OutOfRangeError(absl::StrCat("elements [", begin, ", ", end, ") are no range"));
  }
  return CheckElementsInRange("elements", begin, end - begin, size);
}

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_UPDATE_BACKEND_H_
