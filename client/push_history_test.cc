// PushHistory: what is kept in memory and in a journal directory, what
// survives a reopen (a trainer's restart), and what is dropped.
#include "client/push_history.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace shardopt {
namespace {

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(base ? base : "/tmp", "/", name);
  std::system(absl::StrCat("rm -rf '", dir, "'").c_str());
  return dir;
}

std::vector<float> Gradient(int64_t step) { return std::vector<float>(5, 0.25f * step); }

absl::Status RecordStep(PushHistory& h, int64_t step) {
  const std::vector<float> g = Gradient(step);
  return h.Record(step, DType::kFloat32, 1.0, g.data(), g.size() * sizeof(float));
}

std::vector<float> FloatsOf(const PushedStep& entry) {
  std::vector<float> out(entry.payload->size() / sizeof(float));
  std::memcpy(out.data(), entry.payload->data(), entry.payload->size());
  return out;
}

TEST(PushHistoryTest, WithoutReplayOrJournalNothingIsKept) {
  std::unique_ptr<PushHistory> h = PushHistory::Open({"m", 0, 0, ""}).value();
  EXPECT_FALSE(h->enabled());
  ASSERT_TRUE(RecordStep(*h, 1).ok());
  const absl::Status missing = h->Find(1).status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.message(), "no longer holds its push of step 1"));
  EXPECT_TRUE(absl::StrContains(missing.message(), "replay_steps = 0 and no journal_path"))
      << missing;
}

TEST(PushHistoryTest, MemoryKeepsTheLastReplaySteps) {
  std::unique_ptr<PushHistory> h = PushHistory::Open({"m", 1, 3, ""}).value();
  for (int64_t step = 1; step <= 5; ++step) ASSERT_TRUE(RecordStep(*h, step).ok());
  ASSERT_TRUE(h->RecordDecision(4, {false, 0.5, 2.0}).ok());
  EXPECT_EQ(h->Find(2).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(h->Find(2).status().message(), "steps 3..5 (in memory"));
  EXPECT_EQ(FloatsOf(h->Find(3).value()), Gradient(3));
  const PushedStep four = h->Find(4).value();
  ASSERT_TRUE(four.decision.has_value());
  EXPECT_EQ(four.decision->clip_coef, 0.5);
  EXPECT_FALSE(h->Find(5)->decision.has_value());
  // A repeat of a step replaces it and forgets later ones.
  ASSERT_TRUE(RecordStep(*h, 4).ok());
  EXPECT_EQ(h->newest_step(), 4);
  EXPECT_EQ(h->Find(5).status().code(), absl::StatusCode::kNotFound);
  h->DropThrough(10);  // The newest stays.
  EXPECT_TRUE(h->Find(4).ok());
  EXPECT_EQ(h->Find(3).status().code(), absl::StatusCode::kNotFound);
}

TEST(PushHistoryTest, AJournalSurvivesAReopenAndIsDroppedBelowTheFloor) {
  const std::string dir = TempDir("journal_survives");
  {
    std::unique_ptr<PushHistory> h = PushHistory::Open({"m", 2, 0, dir}).value();
    EXPECT_TRUE(h->persistent());
    for (int64_t step = 1; step <= 6; ++step) ASSERT_TRUE(RecordStep(*h, step).ok());
    ASSERT_TRUE(h->RecordDecision(5, {true, 1.0, 0}).ok());
    ASSERT_TRUE(h->RecordDecision(6, {false, 0.1 + 0.2, 1.0 / 3.0}).ok());
    v1::SetHyperparametersRequest change;
    change.set_effective_step(4);
    change.mutable_optimizer()->mutable_sgd()->set_lr(0.5);
    ASSERT_TRUE(h->RecordChange(change).ok());
    change.set_effective_step(8);
    ASSERT_TRUE(h->RecordChange(change).ok());
    h->DropThrough(2);
  }
  // A restarted trainer finds everything after the floor, bit for bit.
  std::unique_ptr<PushHistory> h = PushHistory::Open({"m", 2, 0, dir}).value();
  EXPECT_EQ(h->newest_step(), 6);
  EXPECT_EQ(h->Find(2).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(FloatsOf(h->Find(3).value()), Gradient(3));
  EXPECT_TRUE(h->Find(5)->decision->skip);
  const StepDecision six = *h->Find(6)->decision;
  EXPECT_EQ(six.clip_coef, 0.1 + 0.2);  // Exact, not rounded through text.
  EXPECT_EQ(six.grad_norm, 1.0 / 3.0);
  EXPECT_EQ(h->ChangesAfter(3).size(), 2u);
  EXPECT_EQ(h->ChangesAfter(4).size(), 1u);
  EXPECT_EQ(h->ChangesAfter(4)[0].optimizer().sgd().lr(), 0.5);
  // A step pushed again after the restart loses its old decision.
  ASSERT_TRUE(RecordStep(*h, 6).ok());
  EXPECT_FALSE(h->Find(6)->decision.has_value());
  h->DropThrough(5);
  EXPECT_EQ(h->Find(5).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(h->ChangesAfter(0).size(), 1u);  // The change at 4 went with the floor.
  std::unique_ptr<PushHistory> again = PushHistory::Open({"m", 2, 0, dir}).value();
  EXPECT_EQ(again->Find(5).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(again->Find(6).ok());
}

TEST(PushHistoryTest, OnlyAnIdenticalRequestIsTheLastWordForItsStep) {
  const std::string dir = TempDir("journal_last_word");
  v1::SetHyperparametersRequest change;
  change.set_model_id("m");
  change.set_effective_step(4);
  change.mutable_optimizer()->mutable_sgd()->set_lr(0.5);
  {
    std::unique_ptr<PushHistory> h = PushHistory::Open({"m", 0, 0, dir}).value();
    EXPECT_FALSE(h->IsLastWord(change));
    ASSERT_TRUE(h->RecordChange(change).ok());
  }
  std::unique_ptr<PushHistory> h = PushHistory::Open({"m", 0, 0, dir}).value();
  EXPECT_TRUE(h->IsLastWord(change));  // Read back from the journal.
  v1::SetHyperparametersRequest other = change;
  other.mutable_optimizer()->mutable_sgd()->set_lr(0.25);
  EXPECT_FALSE(h->IsLastWord(other));
  other = change;
  other.set_effective_step(5);
  EXPECT_FALSE(h->IsLastWord(other));
  v1::SetHyperparametersRequest cancel;
  cancel.set_model_id("m");
  cancel.set_effective_step(4);
  cancel.set_cancel(true);
  ASSERT_TRUE(h->RecordChange(cancel).ok());
  EXPECT_FALSE(h->IsLastWord(change));  // Cancelled since.
}

TEST(PushHistoryTest, ARollbackDropsTheStepsGivenUp) {
  const std::string dir = TempDir("journal_rollback");
  {
    std::unique_ptr<PushHistory> h = PushHistory::Open({"m", 0, 0, dir}).value();
    for (int64_t step = 1; step <= 6; ++step) ASSERT_TRUE(RecordStep(*h, step).ok());
    ASSERT_TRUE(h->RecordDecision(5, {true, 1.0, 0}).ok());
    h->DropAfter(3);
    EXPECT_EQ(h->newest_step(), 3);
    EXPECT_EQ(h->Find(4).status().code(), absl::StatusCode::kNotFound);
    EXPECT_TRUE(h->Find(3).ok());
  }
  std::unique_ptr<PushHistory> h = PushHistory::Open({"m", 0, 0, dir}).value();
  EXPECT_EQ(h->newest_step(), 3);  // Gone from the journal too.
  ASSERT_TRUE(RecordStep(*h, 5).ok());
  EXPECT_FALSE(h->Find(5)->decision.has_value());
  std::unique_ptr<PushHistory> memory = PushHistory::Open({"m", 0, 4, ""}).value();
  for (int64_t step = 1; step <= 4; ++step) ASSERT_TRUE(RecordStep(*memory, step).ok());
  memory->DropAfter(2);
  EXPECT_EQ(memory->newest_step(), 2);
}

TEST(PushHistoryTest, AJournalOfAnotherTrainerOrAFileIsRefused) {
  const std::string dir = TempDir("journal_other");
  {
    std::unique_ptr<PushHistory> h = PushHistory::Open({"m", 0, 0, dir}).value();
    ASSERT_TRUE(RecordStep(*h, 1).ok());
  }
  const absl::Status other = PushHistory::Open({"m", 1, 0, dir}).status();
  EXPECT_EQ(other.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(other.message(), "rank 0, not of model 'm' rank 1")) << other;
  EXPECT_EQ(PushHistory::Open({"n", 0, 0, dir}).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const std::string file = TempDir("journal_file");
  std::ofstream(file) << "old single-file journal";
  EXPECT_EQ(PushHistory::Open({"m", 0, 0, file}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// LAMB on the flat partition: a decision carries every tensor's norms,
// which a restarted trainer must replay to the last bit.
TEST(PushHistoryTest, TensorNormsOfADecisionSurviveAReopen) {
  const std::string dir = TempDir("journal_norms");
  StepDecision decision{false, 0.75, 2.5, {{1.0 / 3.0, 0.0}, {1e-300, 7.25e12}}};
  decision.tensor_norms.push_back({std::numeric_limits<double>::infinity(), 2.0});
  {
    std::unique_ptr<PushHistory> h = PushHistory::Open({"m", 0, 0, dir}).value();
    for (int64_t step = 1; step <= 2; ++step) ASSERT_TRUE(RecordStep(*h, step).ok());
    ASSERT_TRUE(h->RecordDecision(1, decision).ok());
    ASSERT_TRUE(h->RecordDecision(2, {false, 1.0, 0.5}).ok());
  }
  std::unique_ptr<PushHistory> h = PushHistory::Open({"m", 0, 0, dir}).value();
  const StepDecision one = *h->Find(1)->decision;
  EXPECT_EQ(one, decision);
  ASSERT_EQ(one.tensor_norms.size(), 3u);
  EXPECT_EQ(one.tensor_norms[0].weight_squares, 1.0 / 3.0);
  EXPECT_EQ(one.tensor_norms[1].weight_squares, 1e-300);
  EXPECT_TRUE(h->Find(2)->decision->tensor_norms.empty());
  // A decision whose norms were cut off is damaged, not shorter.
  const std::string path = dir + "/decision-000000000001";
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::ofstream(path, std::ios::trunc) << text.substr(0, text.size() - 12);
  EXPECT_EQ(PushHistory::Open({"m", 0, 0, dir}).status().code(), absl::StatusCode::kDataLoss);
  // So is one with more than its count says.
  std::ofstream(path, std::ios::trunc) << text.substr(0, text.size() - 1) << " 0x1p+0\n";
  EXPECT_EQ(PushHistory::Open({"m", 0, 0, dir}).status().code(), absl::StatusCode::kDataLoss);
  std::ofstream(path, std::ios::trunc) << text;
  EXPECT_TRUE(PushHistory::Open({"m", 0, 0, dir}).ok());
}

TEST(PushHistoryTest, ADamagedJournalEntryIsDataLoss) {
  const std::string dir = TempDir("journal_damaged");
  {
    std::unique_ptr<PushHistory> h = PushHistory::Open({"m", 0, 0, dir}).value();
    for (int64_t step = 1; step <= 3; ++step) ASSERT_TRUE(RecordStep(*h, step).ok());
  }
  const std::string newest = dir + "/push-000000000003";
  const std::string older = dir + "/push-000000000002";
  // One byte short: the sizes in its header no longer add up.
  struct stat info;
  ASSERT_EQ(stat(older.c_str(), &info), 0);
  ASSERT_EQ(truncate(older.c_str(), info.st_size - 1), 0);
  std::unique_ptr<PushHistory> h = PushHistory::Open({"m", 0, 0, dir}).value();
  const absl::Status short_entry = h->Find(2).status();
  EXPECT_EQ(short_entry.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(short_entry.message(), "truncated or overlong")) << short_entry;
  EXPECT_EQ(FloatsOf(h->Find(3).value()), Gradient(3));
  // The newest entry, which says whose journal it is, is read on opening.
  std::ofstream(newest, std::ios::trunc) << "not a journal entry";
  const absl::Status opened = PushHistory::Open({"m", 0, 0, dir}).status();
  EXPECT_EQ(opened.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE(absl::StrContains(opened.message(), "not a push journal")) << opened;
}

}  // namespace
}  // namespace shardopt
