#include "tests/support/compose_project.h"

#include <cstdio>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "tests/support/process.h"

namespace shardopt::testing {
namespace {

std::string Trimmed(std::string s) {
  return std::string(absl::StripTrailingAsciiWhitespace(absl::StripLeadingAsciiWhitespace(s)));
}

}  // namespace

std::string ShellQuote(const std::string& s) {
  return absl::StrCat("'", absl::StrReplaceAll(s, {{"'", "'\\''"}}), "'");
}

absl::StatusOr<std::string> RunBounded(const std::string& command, absl::Duration limit) {
  // --kill-after: a command that ignores the TERM still ends.
  const std::string bounded =
      absl::StrCat("timeout --kill-after=5 ", absl::ToInt64Seconds(limit), " ", command);
  auto [rc, output] = RunShell(bounded);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("`", command, "` exited with ", rc,
                                            rc == 124 ? " (ran past its time limit)" : "", ":\n",
                                            output));
  }
  return output;
}

std::string DockerEngineUnavailable() {
  const std::string docker = FindSystemTool("docker");
  if (docker.empty()) return "no docker command (Debian: apt-get install docker.io)";
  absl::StatusOr<std::string> info =
      RunBounded(docker + " version --format '{{.Server.Version}}'", absl::Seconds(20));
  if (!info.ok()) return std::string(info.status().message());
  return "";
}

ComposeProject::ComposeProject(std::string name, std::vector<std::string> compose_files,
                               std::map<std::string, std::string> env)
    : name_(std::move(name)),
      compose_files_(std::move(compose_files)),
      env_(std::move(env)),
      docker_(FindSystemTool("docker")),
      compose_(FindSystemTool("docker-compose")) {
  // What an earlier run of the same project left, if it was killed.
  (void)Compose("down -v --remove-orphans --timeout 1");
}

ComposeProject::~ComposeProject() {
  if (absl::Status s = Down(); !s.ok()) {
    fprintf(stderr, "[test] could not take project %s down: %s\n", name_.c_str(),
            std::string(s.message()).c_str());
  }
}

std::string ComposeProject::Prefix() const {
  std::string prefix = "env";
  for (const auto& [key, value] : env_) absl::StrAppend(&prefix, " ", key, "=", ShellQuote(value));
  // The compose files are Bazel runfiles: symlinks into the source tree.
  absl::StrAppend(&prefix, " ", compose_.empty() ? "docker-compose" : compose_, " --ansi never");
  for (const std::string& file : compose_files_) absl::StrAppend(&prefix, " -f ", ShellQuote(file));
  absl::StrAppend(&prefix, " -p ", name_);
  return prefix;
}

absl::StatusOr<std::string> ComposeProject::Compose(const std::string& args,
                                                    absl::Duration limit) const {
  return RunBounded(absl::StrCat(Prefix(), " ", args), limit);
}

absl::StatusOr<std::string> ComposeProject::Docker(const std::string& args,
                                                   absl::Duration limit) const {
  return RunBounded(absl::StrCat(docker_, " ", args), limit);
}

absl::Status ComposeProject::Up(absl::Duration limit) const {
  containers_.clear();
  return Compose("up -d --no-color", limit).status();
}

absl::Status ComposeProject::Down() const {
  containers_.clear();
  // --timeout: the containers' own stop_grace_period is what is tested
  // elsewhere; here nothing needs a clean stop any more.
  return Compose("down -v --remove-orphans --timeout 2").status();
}

absl::StatusOr<std::string> ComposeProject::Container(const std::string& service) const {
  if (auto known = containers_.find(service); known != containers_.end()) return known->second;
  // Every container of the project at once, by compose's labels (one docker
  // call, not one docker-compose start-up per service).
  absl::StatusOr<std::string> listing =
      Docker(absl::StrCat("ps -a --no-trunc --filter label=com.docker.compose.project=", name_,
                          " --format '{{.Label \"com.docker.compose.service\"}} {{.ID}}'"));
  if (!listing.ok()) return listing.status();
  for (absl::string_view line : absl::StrSplit(*listing, '\n', absl::SkipWhitespace())) {
    std::vector<std::string> words = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (words.size() == 2) containers_[words[0]] = words[1];
  }
  if (auto known = containers_.find(service); known != containers_.end()) return known->second;
  return absl::NotFoundError(absl::StrCat("project ", name_, " has no container of ", service));
}

absl::StatusOr<std::string> ComposeProject::Inspect(const std::string& service,
                                                    const std::string& format) const {
  absl::StatusOr<std::string> id = Container(service);
  if (!id.ok()) return id.status();
  absl::StatusOr<std::string> out =
      Docker(absl::StrCat("inspect --format ", ShellQuote(format), " ", *id));
  if (!out.ok()) return out.status();
  return Trimmed(*out);
}

absl::StatusOr<int> ComposeProject::AwaitExit(const std::string& service,
                                              absl::Duration limit) const {
  const absl::Time give_up = absl::Now() + limit;
  std::string state = "?";
  while (true) {
    absl::StatusOr<std::string> out = Inspect(service, "{{.State.Status}} {{.State.ExitCode}}");
    if (!out.ok()) return out.status();
    state = *out;
    if (absl::StartsWith(state, "exited ")) {
      int code = -1;
      if (!absl::SimpleAtoi(state.substr(7), &code)) {
        return absl::InternalError(absl::StrCat(service, ": unreadable state '", state, "'"));
      }
      return code;
    }
    if (absl::Now() >= give_up) break;
    absl::SleepFor(absl::Milliseconds(200));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(service, " of project ", name_, " did not exit within ",
                   absl::FormatDuration(limit), " (state: ", state, ")"));
}

absl::Status ComposeProject::AwaitHealthy(const std::string& service, absl::Duration limit) const {
  const absl::Time give_up = absl::Now() + limit;
  std::string health = "?";
  while (absl::Now() < give_up) {
    absl::StatusOr<std::string> out = Inspect(service, "{{.State.Health.Status}}");
    if (!out.ok()) return out.status();
    health = *out;
    if (health == "healthy") return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(200));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(service, " of project ", name_, " was not healthy within ",
                   absl::FormatDuration(limit), " (health: ", health, ")"));
}

std::string ComposeProject::Logs(const std::string& service) const {
  absl::StatusOr<std::string> out = Compose("logs --no-color " + service);
  return out.ok() ? *out : std::string(out.status().message());
}

}  // namespace shardopt::testing
