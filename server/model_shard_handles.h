// StepHold and ReadPin: movable handles that hold a ModelShard in a state
// for as long as they live (ModelShard::HoldStep, ModelShard::PullTarget).
// Each is released through its shard, so neither may outlive it.
#ifndef SHARDOPT_SERVER_MODEL_SHARD_HANDLES_H_
#define SHARDOPT_SERVER_MODEL_SHARD_HANDLES_H_

#include <cstdint>
#include <utility>

namespace shardopt {

class ModelShard;

// Keeps a ModelShard's step `step` + 1 from being applied once it reaches
// version `step`, for as long as it lives (see ModelShard::CheckpointAt).
// Holds stop holding once the shard shuts down. Movable; must not outlive
// the shard.
class StepHold {
 public:
  StepHold() = default;
  StepHold(StepHold&& other) noexcept { *this = std::move(other); }
  StepHold& operator=(StepHold&& other) noexcept;
  ~StepHold() { Release(); }
  bool held() const { return shard_ != nullptr; }
  int64_t step() const { return step_; }
  void Release();

 private:
  friend class ModelShard;
  StepHold(ModelShard* shard, int64_t step) : shard_(shard), step_(step) {}
  ModelShard* shard_ = nullptr;
  int64_t step_ = 0;
};

// Asynchronous modes: while it lives, no push is applied to its shard, so a
// pull reads one whole version (see ModelShard::PullTarget). Movable; must
// not outlive the shard.
class ReadPin {
 public:
  ReadPin() = default;
  ReadPin(ReadPin&& other) noexcept { *this = std::move(other); }
  ReadPin& operator=(ReadPin&& other) noexcept;
  ~ReadPin() { Release(); }
  bool held() const { return shard_ != nullptr; }
  void Release();

 private:
  friend class ModelShard;
  explicit ReadPin(ModelShard* shard) : shard_(shard) {}
  ModelShard* shard_ = nullptr;
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_MODEL_SHARD_HANDLES_H_
