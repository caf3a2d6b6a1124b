// Test support: trainer jobs of real processes (tests/test_trainer) against
// real shard servers, and what the durability and chaos tests check of them:
// start, restart and await trainers, the shards' versions, checkpoint writes
// in progress, and the bit-exact comparison with an uninterrupted run.
#ifndef SHARDOPT_TESTS_SUPPORT_TRAINING_JOB_H_
#define SHARDOPT_TESTS_SUPPORT_TRAINING_JOB_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "client/trainer_client.h"
#include "tests/support/process.h"
#include "tests/support/synthetic.h"

namespace shardopt::testing {

// The data seed every test_trainer of these jobs uses.
inline constexpr uint64_t kJobSeed = 7;

std::vector<std::string> TrainerArgs(const std::vector<std::string>& servers, uint32_t rank,
                                     uint32_t trainers, const std::string& models, int steps,
                                     const std::string& out_dir,
                                     const std::vector<std::string>& extra = {});

// Starts (or restarts) trainer `rank` of `trainers` into `*proc`; it writes to
// out_root/rank<rank>. (gtest assertions: call under ASSERT_NO_FATAL_FAILURE.)
void StartTrainer(const std::vector<std::string>& servers, uint32_t rank, uint32_t trainers,
                  const std::string& models, int steps, const std::string& out_root,
                  const std::vector<std::string>& extra, std::unique_ptr<ChildProcess>* proc);

// Starts T trainers (see StartTrainer).
void StartTrainers(const std::vector<std::string>& servers, uint32_t trainers,
                   const std::string& models, int steps, const std::string& out_root,
                   const std::vector<std::string>& extra,
                   std::vector<std::unique_ptr<ChildProcess>>* procs);

// Every trainer exits 0 within `timeout`.
void AwaitTrainers(std::vector<std::unique_ptr<ChildProcess>>& procs,
                   absl::Duration timeout = absl::Seconds(240));

// Runs T trainer processes to the end; each writes to out_root/rank<r>.
void RunTrainers(const std::vector<std::string>& servers, uint32_t trainers,
                 const std::string& models, int steps, const std::string& out_root,
                 const std::vector<std::string>& extra = {});

// Each rank's final parameters equal the uninterrupted reference of `spec`
// (with planted inf/NaN, rank 0 plants them in the last tensor, as
// test_trainer does).
void ExpectMatchesReference(const ModelSpec& spec, uint32_t shards, int steps,
                            const std::string& out_root, ReferenceOptions options = {});
// The same for test_trainer's model `name`.
void ExpectMatchesReference(const std::string& name, uint32_t shards, uint32_t trainers, int steps,
                            const std::string& out_root, double max_grad_norm = 0,
                            const ReferenceOptions& options = {});

// Every shard is at version `steps` and applied (or skipped) each step once.
// (gtest assertions: call under ASSERT_NO_FATAL_FAILURE where it matters.)
void ExpectEveryStepAppliedOnce(const std::vector<std::string>& addresses, const std::string& model,
                                int64_t steps);

// The model's version on the shard at `address` (-1 when unreachable or not
// there yet).
int64_t VersionOn(const std::string& address, const std::string& model);
// Waits (bounded: 60 s) until the model on `address` reaches `version`; a
// test failure saying where it got to when it does not.
void AwaitVersion(const std::string& address, const std::string& model, int64_t version);
// Whether shard `index` of `shards` is writing its part (data file or part
// record) of some periodic checkpoint under `model_root`: a temporary file
// of it is there.
bool CheckpointInProgress(const std::string& model_root, uint32_t index, uint32_t shards);
// Waits (bounded by `timeout`) for CheckpointInProgress; whether it came.
bool AwaitCheckpointInProgress(const std::string& model_root, uint32_t index, uint32_t shards,
                               absl::Duration timeout);

// The Checkpoint RPC on every shard for the same step and directory: each
// writes its part, only the last one finds every part there and commits.
// (gtest assertions: call under ASSERT_NO_FATAL_FAILURE.)
void CheckpointEveryShard(const std::vector<std::string>& servers, const std::string& model,
                          int64_t step, const std::string& dir);

// A number test_trainer wrote to out_root/rank<r>/<model>.<what> (replayed
// pushes, rollbacks).
int64_t TrainerCount(const std::string& out_root, uint32_t rank, const std::string& model,
                     const std::string& what);

}  // namespace shardopt::testing

#endif  // SHARDOPT_TESTS_SUPPORT_TRAINING_JOB_H_
