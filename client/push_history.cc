#include "client/push_history.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/push_journal.h"
#include "google/protobuf/util/message_differencer.h"

namespace shardopt {
namespace {

constexpr char kPushPrefix[] = "push-";
constexpr char kDecisionPrefix[] = "decision-";
constexpr char kChangePrefix[] = "change-";
constexpr char kRunFile[] = "run";

// "push-000000000012" -> 12 for the given prefix.
std::optional<int64_t> StepOfName(const std::string& name, absl::string_view prefix) {
  if (!absl::StartsWith(name, prefix)) return std::nullopt;
  int64_t step = 0;
  if (!absl::SimpleAtoi(name.substr(prefix.size()), &step)) return std::nullopt;
  return step;
}

// Decisions as text with exact (hex) doubles: "skip clip_coef grad_norm",
// then, with trust norms, their count and each tensor's two squared norms.
std::string EncodeDecision(const StepDecision& d) {
  std::string text = absl::StrFormat("%d %a %a", d.skip ? 1 : 0, d.clip_coef, d.grad_norm);
  if (!d.tensor_norms.empty()) {
    absl::StrAppendFormat(&text, " %d", d.tensor_norms.size());
    for (const TensorNorms& n : d.tensor_norms) {
      absl::StrAppendFormat(&text, " %a %a", n.weight_squares, n.update_squares);
    }
  }
  return text + "\n";
}

absl::StatusOr<StepDecision> DecodeDecision(const std::string& text, const std::string& path) {
  int skip = 0;
  StepDecision d;
  int used = 0;
  if (std::sscanf(text.c_str(), "%d %la %la%n", &skip, &d.clip_coef, &d.grad_norm, &used) != 3) {
    return absl::DataLossError(absl::StrCat(path, ": not a journaled decision"));
  }
  d.skip = skip != 0;
  const char* rest = text.c_str() + used;
  size_t count = 0;
  int read = 0;
  if (std::sscanf(rest, " %zu%n", &count, &read) == 1) {
    rest += read;
    // (Bounded by the text: each norm takes at least two characters.)
    if (count > text.size()) {
      return absl::DataLossError(absl::StrCat(path, ": a damaged journaled decision"));
    }
    d.tensor_norms.resize(count);
    for (TensorNorms& n : d.tensor_norms) {
      if (std::sscanf(rest, " %la %la%n", &n.weight_squares, &n.update_squares, &read) != 2) {
        return absl::DataLossError(absl::StrCat(path, ": a damaged journaled decision"));
      }
      rest += read;
    }
  }
  while (*rest == ' ' || *rest == '\n') ++rest;
  if (*rest != '\0') {
    return absl::DataLossError(absl::StrCat(path, ": a damaged journaled decision"));
  }
  return d;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PushHistory>> PushHistory::Open(const PushHistoryOptions& options) {
  std::unique_ptr<PushHistory> history(new PushHistory(options));
  if (history->persistent()) {
    if (absl::Status s = history->Load(); !s.ok()) return s;
  }
  return history;
}

std::string PushHistory::PushPath(int64_t step) const {
  return JoinPath(options_.journal_dir, absl::StrFormat("%s%012d", kPushPrefix, step));
}
std::string PushHistory::DecisionPath(int64_t step) const {
  return JoinPath(options_.journal_dir, absl::StrFormat("%s%012d", kDecisionPrefix, step));
}
std::string PushHistory::ChangePath(int64_t step) const {
  return JoinPath(options_.journal_dir, absl::StrFormat("%s%012d", kChangePrefix, step));
}

absl::Status PushHistory::Load() {
  FileEnv* env = options_.env;
  const std::string& dir = options_.journal_dir;
  absl::StatusOr<FileInfo> info = env->Stat(dir);
  if (info.ok() && info->type != FileType::kDirectory) {
    return absl::FailedPreconditionError(
        absl::StrCat("journal_path ", dir, " is not a directory (the journal is a directory "
                     "of one file per step)"));
  }
  if (absl::Status s = env->CreateDirs(dir); !s.ok()) return s;
  absl::StatusOr<std::vector<std::string>> names = env->ListDirectory(dir);
  if (!names.ok()) return names.status();
  absl::MutexLock lock(&mu_);
  for (const std::string& name : *names) {
    if (name == kRunFile) {
      absl::StatusOr<std::string> run = ReadFileToString(env, JoinPath(dir, name));
      if (!run.ok()) return run.status();
      run_id_ = *run;
    } else if (IsAtomicTempFile(name)) {
      // What a write cut off by this trainer's death left.
      env->RemoveFile(JoinPath(dir, name)).IgnoreError();
    } else if (std::optional<int64_t> step = StepOfName(name, kPushPrefix)) {
      journaled_.insert(*step);
    } else if (std::optional<int64_t> step = StepOfName(name, kDecisionPrefix)) {
      absl::StatusOr<std::string> text = ReadFileToString(env, JoinPath(dir, name));
      if (!text.ok()) return text.status();
      absl::StatusOr<StepDecision> d = DecodeDecision(*text, JoinPath(dir, name));
      if (!d.ok()) return d.status();
      decisions_[*step] = *d;
    } else if (std::optional<int64_t> step = StepOfName(name, kChangePrefix)) {
      absl::StatusOr<std::string> bytes = ReadFileToString(env, JoinPath(dir, name));
      if (!bytes.ok()) return bytes.status();
      v1::SetHyperparametersRequest request;
      if (!request.ParseFromString(*bytes)) {
        return absl::DataLossError(absl::StrCat(JoinPath(dir, name), ": not a change request"));
      }
      changes_[*step] = request;
    }
  }
  if (!journaled_.empty()) {
    // The newest entry tells whose journal this is.
    absl::StatusOr<JournaledPush> newest =
        ReadPushJournalHeader(PushPath(*journaled_.rbegin()), options_.env);
    if (!newest.ok()) return newest.status();
    if (newest->model_id != options_.model_id || newest->trainer_rank != options_.trainer_rank) {
      return absl::FailedPreconditionError(absl::StrCat(
          "journal ", dir, " holds the pushes of model '", newest->model_id, "' rank ",
          newest->trainer_rank, ", not of model '", options_.model_id, "' rank ",
          options_.trainer_rank, ": give each trainer and model a journal of its own"));
    }
  }
  return absl::OkStatus();
}

absl::Status PushHistory::BindToRun(const std::string& run_id) {
  std::vector<std::string> gone;
  {
    absl::MutexLock lock(&mu_);
    if (run_id_ == run_id) return absl::OkStatus();
    if (!run_id_.empty()) {
      for (int64_t step : journaled_) gone.push_back(PushPath(step));
      for (const auto& [step, d] : decisions_) gone.push_back(DecisionPath(step));
      for (const auto& [step, c] : changes_) gone.push_back(ChangePath(step));
      memory_.clear();
      journaled_.clear();
      decisions_.clear();
      changes_.clear();
    }
    run_id_ = run_id;
  }
  if (!persistent()) return absl::OkStatus();
  for (const std::string& path : gone) {
    if (absl::Status s = options_.env->RemoveFile(path); !s.ok() && !absl::IsNotFound(s)) return s;
  }
  return WriteFileAtomically(options_.env, JoinPath(options_.journal_dir, kRunFile), run_id);
}

absl::Status PushHistory::Record(int64_t step, DType dtype, double loss_scale, const void* payload,
                                 size_t bytes) {
  if (!enabled()) return absl::OkStatus();
  if (persistent()) {
    JournaledPush entry;
    entry.model_id = options_.model_id;
    entry.trainer_rank = options_.trainer_rank;
    entry.step = step;
    entry.dtype = dtype;
    entry.loss_scale = loss_scale;
    if (absl::Status s = WritePushJournal(PushPath(step), entry, payload, bytes, options_.env); !s.ok()) {
      return s;
    }
    absl::MutexLock lock(&mu_);
    journaled_.insert(step);
    // A decision of an earlier push of this step (a trainer that restarted
    // and pushes again) no longer applies.
    if (decisions_.erase(step) > 0) options_.env->RemoveFile(DecisionPath(step)).IgnoreError();
    return absl::OkStatus();
  }
  PushedStep entry;
  entry.step = step;
  entry.dtype = dtype;
  entry.loss_scale = loss_scale;
  entry.payload = std::make_shared<const std::vector<char>>(
      static_cast<const char*>(payload), static_cast<const char*>(payload) + bytes);
  absl::MutexLock lock(&mu_);
  while (!memory_.empty() && memory_.back().step >= step) memory_.pop_back();
  memory_.push_back(std::move(entry));
  while (memory_.size() > static_cast<size_t>(options_.replay_steps)) memory_.pop_front();
  return absl::OkStatus();
}

absl::Status PushHistory::RecordDecision(int64_t step, const StepDecision& decision) {
  if (!enabled()) return absl::OkStatus();
  if (persistent()) {
    if (absl::Status s =
            WriteFileAtomically(options_.env, DecisionPath(step), EncodeDecision(decision));
        !s.ok()) {
      return s;
    }
  }
  absl::MutexLock lock(&mu_);
  if (persistent()) decisions_[step] = decision;
  for (PushedStep& entry : memory_) {
    if (entry.step == step) entry.decision = decision;
  }
  return absl::OkStatus();
}

absl::StatusOr<PushedStep> PushHistory::Find(int64_t step) const {
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const PushedStep& entry : memory_) {
      if (entry.step == step) return entry;
    }
    if (journaled_.count(step) == 0) {
      return absl::NotFoundError(absl::StrCat("this trainer no longer holds its push of step ",
                                              step, " (it keeps ", DescribeLocked(), ")"));
    }
  }
  absl::StatusOr<JournaledPush> read = ReadPushJournal(PushPath(step), options_.env);
  if (!read.ok()) return read.status();
  PushedStep entry;
  entry.step = step;
  entry.dtype = read->dtype;
  entry.loss_scale = read->loss_scale;
  entry.payload = std::make_shared<const std::vector<char>>(std::move(read->payload));
  absl::ReaderMutexLock lock(&mu_);
  if (auto d = decisions_.find(step); d != decisions_.end()) entry.decision = d->second;
  return entry;
}

int64_t PushHistory::newest_step() const {
  absl::ReaderMutexLock lock(&mu_);
  int64_t newest = memory_.empty() ? 0 : memory_.back().step;
  if (!journaled_.empty()) newest = std::max(newest, *journaled_.rbegin());
  return newest;
}

void PushHistory::DropThrough(int64_t floor) {
  std::vector<std::string> gone;
  {
    absl::MutexLock lock(&mu_);
    while (memory_.size() > 1 && memory_.front().step <= floor) memory_.pop_front();
    while (journaled_.size() > 1 && *journaled_.begin() <= floor) {
      gone.push_back(PushPath(*journaled_.begin()));
      journaled_.erase(journaled_.begin());
    }
    // Decisions go with their pushes.
    const int64_t oldest = journaled_.empty() ? (memory_.empty() ? floor + 1 : memory_.front().step)
                                              : *journaled_.begin();
    while (!decisions_.empty() && decisions_.begin()->first < oldest) {
      if (persistent()) gone.push_back(DecisionPath(decisions_.begin()->first));
      decisions_.erase(decisions_.begin());
    }
    // A shard restored at version v >= floor needs the changes after v only.
    while (!changes_.empty() && changes_.begin()->first <= floor) {
      if (persistent()) gone.push_back(ChangePath(changes_.begin()->first));
      changes_.erase(changes_.begin());
    }
  }
  // Best effort: a file left behind only costs space, and goes next time.
  for (const std::string& path : gone) options_.env->RemoveFile(path).IgnoreError();
}

void PushHistory::DropAfter(int64_t version) {
  std::vector<std::string> gone;
  {
    absl::MutexLock lock(&mu_);
    while (!memory_.empty() && memory_.back().step > version) memory_.pop_back();
    while (!journaled_.empty() && *journaled_.rbegin() > version) {
      gone.push_back(PushPath(*journaled_.rbegin()));
      journaled_.erase(std::prev(journaled_.end()));
    }
    while (!decisions_.empty() && decisions_.rbegin()->first > version) {
      if (persistent()) gone.push_back(DecisionPath(decisions_.rbegin()->first));
      decisions_.erase(std::prev(decisions_.end()));
    }
  }
  // (This process no longer lists them whatever happens; a file that cannot
  // be removed would come back only with a restart.)
  for (const std::string& path : gone) options_.env->RemoveFile(path).IgnoreError();
}

absl::Status PushHistory::RecordChange(const v1::SetHyperparametersRequest& request) {
  // Kept even without replay history (they are small): every push carries
  // the changes still to come.
  if (persistent()) {
    if (absl::Status s = WriteFileAtomically(options_.env, ChangePath(request.effective_step()),
                                             request.SerializeAsString());
        !s.ok()) {
      return s;
    }
  }
  absl::MutexLock lock(&mu_);
  changes_[request.effective_step()] = request;
  return absl::OkStatus();
}

std::vector<v1::SetHyperparametersRequest> PushHistory::ChangesAfter(int64_t version) const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<v1::SetHyperparametersRequest> out;
  for (auto it = changes_.upper_bound(version); it != changes_.end(); ++it) {
    if (!it->second.cancel()) out.push_back(it->second);
  }
  return out;
}

std::vector<v1::SetHyperparametersRequest> PushHistory::LastWordsAfter(int64_t version) const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<v1::SetHyperparametersRequest> out;
  for (auto it = changes_.upper_bound(version); it != changes_.end(); ++it) {
    out.push_back(it->second);
  }
  return out;
}

bool PushHistory::IsLastWord(const v1::SetHyperparametersRequest& request) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = changes_.find(request.effective_step());
  return it != changes_.end() &&
         google::protobuf::util::MessageDifferencer::Equals(it->second, request);
}

std::string PushHistory::Describe() const {
  absl::ReaderMutexLock lock(&mu_);
  return DescribeLocked();
}

std::string PushHistory::DescribeLocked() const {
  const std::string where =
      persistent() ? absl::StrCat("journal ", options_.journal_dir)
                   : absl::StrCat("in memory, replay_steps = ", options_.replay_steps);
  if (!enabled()) return "no steps: replay_steps = 0 and no journal_path";
  int64_t lo = 0, hi = 0;
  if (persistent() && !journaled_.empty()) {
    lo = *journaled_.begin();
    hi = *journaled_.rbegin();
  } else if (!memory_.empty()) {
    lo = memory_.front().step;
    hi = memory_.back().step;
  } else {
    return absl::StrCat("no steps yet (", where, ")");
  }
  return absl::StrCat("steps ", lo, "..", hi, " (", where, ")");
}

}  // namespace shardopt
