#include "tests/support/training_job.h"

#include <cstring>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint_files.h"
#include "common/file.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tests/support/raw_calls.h"

namespace shardopt::testing {

std::vector<std::string> TrainerArgs(const std::vector<std::string>& servers, uint32_t rank,
                                     uint32_t trainers, const std::string& models, int steps,
                                     const std::string& out_dir,
                                     const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"--servers=" + absl::StrJoin(servers, ","),
                                   absl::StrCat("--rank=", rank),
                                   absl::StrCat("--num_trainers=", trainers),
                                   "--models=" + models,
                                   absl::StrCat("--steps=", steps),
                                   absl::StrCat("--seed=", kJobSeed),
                                   "--out_dir=" + out_dir};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

// Starts (or restarts) trainer `rank` of `trainers` into `*proc`; it writes to
// out_root/rank<rank>.
void StartTrainer(const std::vector<std::string>& servers, uint32_t rank, uint32_t trainers,
                  const std::string& models, int steps, const std::string& out_root,
                  const std::vector<std::string>& extra, std::unique_ptr<ChildProcess>* proc) {
  const std::string out_dir = absl::StrCat(out_root, "/rank", rank);
  ASSERT_EQ(system(absl::StrCat("mkdir -p ", out_dir).c_str()), 0);
  auto started =
      ChildProcess::Start(Runfile("tests/test_trainer"),
                          TrainerArgs(servers, rank, trainers, models, steps, out_dir, extra));
  ASSERT_TRUE(started.ok()) << started.status();
  *proc = std::move(*started);
}

// Starts T trainers (see StartTrainer).
void StartTrainers(const std::vector<std::string>& servers, uint32_t trainers,
                   const std::string& models, int steps, const std::string& out_root,
                   const std::vector<std::string>& extra,
                   std::vector<std::unique_ptr<ChildProcess>>* procs) {
  procs->resize(trainers);
  for (uint32_t r = 0; r < trainers; ++r) {
    ASSERT_NO_FATAL_FAILURE(
        StartTrainer(servers, r, trainers, models, steps, out_root, extra, &(*procs)[r]));
  }
}

// Every trainer exits 0 within `timeout`.
void AwaitTrainers(std::vector<std::unique_ptr<ChildProcess>>& procs,
                   absl::Duration timeout) {
  for (auto& proc : procs) {
    std::optional<int> rc = proc->Wait(timeout);
    ASSERT_TRUE(rc.has_value()) << "trainer did not finish";
    ASSERT_EQ(*rc, 0) << "trainer failed";
  }
}

// Runs T trainer processes to the end; each writes to out_root/rank<r>.
void RunTrainers(const std::vector<std::string>& servers, uint32_t trainers,
                 const std::string& models, int steps, const std::string& out_root,
                 const std::vector<std::string>& extra) {
  std::vector<std::unique_ptr<ChildProcess>> procs;
  ASSERT_NO_FATAL_FAILURE(StartTrainers(servers, trainers, models, steps, out_root, extra, &procs));
  AwaitTrainers(procs);
}

// Each rank's final parameters equal the uninterrupted reference of `spec`
// (with planted inf/NaN, rank 0 plants them in the last tensor, as
// test_trainer does).
void ExpectMatchesReference(const ModelSpec& spec, uint32_t shards, int steps,
                            const std::string& out_root, ReferenceOptions options) {
  const std::string& name = spec.model_id;
  const ModelLayout layout =
      ModelLayout::Create(spec.tensors, spec.alignment, shards, spec.partition).value();
  if (!options.plant_inf_steps.empty()) options.plant_inf_element = layout.tensors().back().offset;
  const std::vector<float> expected = ReferenceRun(spec, layout, steps, kJobSeed, options);
  for (uint32_t r = 0; r < spec.num_trainers; ++r) {
    absl::StatusOr<std::vector<float>> got =
        ReadFloats(absl::StrCat(out_root, "/rank", r, "/", name, ".bin"));
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), expected.size());
    size_t mismatches = 0;
    for (size_t i = 0; i < expected.size(); ++i) {
      if (std::memcmp(&(*got)[i], &expected[i], sizeof(float)) != 0 && mismatches++ < 5) {
        ADD_FAILURE() << name << " rank " << r << " element " << i << ": " << (*got)[i]
                      << " != " << expected[i];
      }
    }
    EXPECT_EQ(mismatches, 0u) << name << " rank " << r << " on " << shards << " shards";
  }
}

// The same for test_trainer's model `name`.
void ExpectMatchesReference(const std::string& name, uint32_t shards, uint32_t trainers, int steps,
                            const std::string& out_root, double max_grad_norm,
                            const ReferenceOptions& options) {
  ModelSpec spec = SyntheticModelSpec(name, OptimizerByName(name).value(), trainers);
  spec.max_grad_norm = max_grad_norm;
  ExpectMatchesReference(spec, shards, steps, out_root, options);
}

void ExpectEveryStepAppliedOnce(const std::vector<std::string>& addresses, const std::string& model,
                                int64_t steps) {
  for (uint32_t i = 0; i < addresses.size(); ++i) {
    v1::InspectResponse info;
    ASSERT_TRUE(RawInspect(*NewStub(addresses[i]), model, &info).ok()) << "shard " << i;
    EXPECT_EQ(info.version(), steps) << "shard " << i;
    EXPECT_EQ(info.optimizer_steps() + info.skipped_steps(), steps) << "shard " << i;
  }
}

// The model's version on the shard at `address` (-1 when unreachable or not
// there yet).
int64_t VersionOn(const std::string& address, const std::string& model) {
  auto stub = NewStub(address);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::ServerInfo info;
  if (!stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok()) return -1;
  for (const v1::ModelSummary& m : info.models()) {
    if (m.model_id() == model) return m.version();
  }
  return -1;
}

void AwaitVersion(const std::string& address, const std::string& model, int64_t version) {
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  int64_t seen = VersionOn(address, model);
  while (absl::Now() < give_up && seen < version) {
    absl::SleepFor(absl::Milliseconds(1));
    seen = VersionOn(address, model);
  }
  if (seen < version) {
    ADD_FAILURE() << "model '" << model << "' on " << address << " did not reach version "
                  << version << " within 60 s (it is at " << seen << ")";
  }
}

bool CheckpointInProgress(const std::string& model_root, uint32_t index, uint32_t shards) {
  const std::string data_file = CheckpointDataFileName(index, shards);
  const std::string part_record = CheckpointPartRecordName(index, shards);
  for (const StepDirectory& step :
       ListStepDirectories(model_root).value_or(std::vector<StepDirectory>())) {
    for (const std::string& name :
         FileEnv::Default()->ListDirectory(step.directory).value_or(std::vector<std::string>())) {
      if (IsAtomicTempFile(name, data_file) || IsAtomicTempFile(name, part_record)) return true;
    }
  }
  return false;
}

bool AwaitCheckpointInProgress(const std::string& model_root, uint32_t index, uint32_t shards,
                               absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  while (!CheckpointInProgress(model_root, index, shards)) {
    if (absl::Now() >= give_up) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

int64_t TrainerCount(const std::string& out_root, uint32_t rank, const std::string& model,
                     const std::string& what) {
  absl::StatusOr<std::vector<float>> count =
      ReadFloats(absl::StrCat(out_root, "/rank", rank, "/", model, ".", what));
  EXPECT_TRUE(count.ok()) << count.status();
  return count.ok() && !count->empty() ? static_cast<int64_t>((*count)[0]) : -1;
}

void CheckpointEveryShard(const std::vector<std::string>& servers, const std::string& model,
                          int64_t step, const std::string& dir) {
  int committed = 0;
  for (uint32_t i = 0; i < servers.size(); ++i) {
    auto stub = NewStub(servers[i]);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::CheckpointRequest request;
    request.set_model_id(model);
    request.set_directory(dir);
    request.set_step(step);
    request.set_shard_index(i);
    v1::CheckpointResponse response;
    const grpc::Status s = stub->Checkpoint(&context, request, &response);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(response.step(), step);
    EXPECT_GT(response.bytes_written(), 0u);
    committed += response.committed();
    // Only the last shard finds every part present.
    EXPECT_EQ(response.committed(), i + 1 == servers.size()) << "shard " << i;
  }
  EXPECT_EQ(committed, 1);
}

}  // namespace shardopt::testing
