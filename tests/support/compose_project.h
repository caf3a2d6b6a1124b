// Test support: one docker-compose project of deploy/docker-compose.yml,
// driven through the docker and docker-compose command lines.
//
// Every command runs under `timeout` (its bound is part of the call), with
// the project's environment (image tags, subnet, trainer flags: the compose
// file's SHARDOPT_* variables) and its own project name, so that projects
// never share containers, networks or volumes. A failed command's status
// names the command, its exit code and its output. The destructor takes the
// project down with its volumes (`down -v`), whatever happened before; the
// constructor does the same first, for what a killed earlier run left.
#ifndef SHARDOPT_TESTS_SUPPORT_COMPOSE_PROJECT_H_
#define SHARDOPT_TESTS_SUPPORT_COMPOSE_PROJECT_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace shardopt::testing {

// Why no Docker engine can be used here ("" when one answers).
std::string DockerEngineUnavailable();

// `command` with /bin/sh under `timeout`: its output, or an error naming the
// command, the exit code (124: it ran out of time) and the output.
absl::StatusOr<std::string> RunBounded(const std::string& command, absl::Duration limit);

// A word for /bin/sh: `s` in single quotes.
std::string ShellQuote(const std::string& s);

class ComposeProject {
 public:
  // `compose_files`: the first, then the ones that add to it (-f each).
  ComposeProject(std::string name, std::vector<std::string> compose_files,
                 std::map<std::string, std::string> env);
  ~ComposeProject();
  ComposeProject(const ComposeProject&) = delete;
  ComposeProject& operator=(const ComposeProject&) = delete;

  const std::string& name() const { return name_; }

  // `docker-compose <args>` of this project, within `limit`.
  absl::StatusOr<std::string> Compose(const std::string& args,
                                      absl::Duration limit = absl::Seconds(60)) const;
  // `docker <args>`, within `limit`.
  absl::StatusOr<std::string> Docker(const std::string& args,
                                     absl::Duration limit = absl::Seconds(30)) const;

  // `up -d`: returns once every container runs (the trainers start only when
  // the shards report healthy, so this waits for the shards' health).
  absl::Status Up(absl::Duration limit = absl::Seconds(120)) const;
  // `down -v`: containers, network and volumes removed.
  absl::Status Down() const;

  // The container of `service` (its id), found by the compose labels with
  // docker (milliseconds; docker-compose takes half a second to start) and
  // remembered: the id stays the same through kill, stop and start; Up() and
  // Down() forget it.
  absl::StatusOr<std::string> Container(const std::string& service) const;
  // `docker inspect --format=<format>` of the service's container, trimmed.
  absl::StatusOr<std::string> Inspect(const std::string& service, const std::string& format) const;
  // Waits until the service's container has exited; its exit code. The
  // error says what it was doing when `limit` ran out.
  absl::StatusOr<int> AwaitExit(const std::string& service, absl::Duration limit) const;
  // Waits until the service's health check reports "healthy".
  absl::Status AwaitHealthy(const std::string& service, absl::Duration limit) const;
  // The service's log (stdout and stderr), for checks and for failure reports.
  std::string Logs(const std::string& service) const;

  // The project's network as docker names it ("<project>_shardnet").
  std::string Network() const { return name_ + "_shardnet"; }

 private:
  std::string Prefix() const;  // env ... docker-compose -f FILE... -p NAME

  std::string name_;
  std::vector<std::string> compose_files_;
  std::map<std::string, std::string> env_;
  std::string docker_;
  std::string compose_;
  mutable std::map<std::string, std::string> containers_;  // service -> id
};

}  // namespace shardopt::testing

#endif  // SHARDOPT_TESTS_SUPPORT_COMPOSE_PROJECT_H_
