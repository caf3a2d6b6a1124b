// The cluster of deploy/docker-compose.yml, in containers: the images
// deploy/docker/build_images.sh makes from this build's binaries, 2 shard
// servers and 2 trainers (test_trainer, the synthetic model, so that the
// final flat parameters can be compared with the single-process reference)
// on the compose file's internal network, each case a compose project of its
// own. Each case trains through one kind of trouble and then checks that
// every shard applied every step exactly once (Inspect: version and
// optimizer steps equal the step count) and that both trainers hold the
// reference run's parameters bit for bit:
//   - none;
//   - `docker kill` of a shard mid-run, `docker-compose start` of it: it
//     restores from the shared checkpoint volume, trainers re-push;
//   - a shard's network disconnected for 5 s mid-run and reconnected at the
//     same address: the job holds still, then goes on;
//   - a rolling restart (SIGTERM, exit 0, start) of every shard in turn;
//   - none, watched by docker-compose.monitoring.yml's Prometheus, whose
//     query API then shows both shards scraped and the job's last step.
// And `stop`/`down` of a running job take seconds: every container ends on
// SIGTERM rather than at the end of its grace period.
// The test reaches the shards from the host over the network's bridge
// (internal networks still have the host end), and reads the trainers'
// results from host directories mounted at /out.
//
// Needs a Docker engine (tools/docker_engine.sh; tools/run_tests.sh starts
// one and says so with SHARDOPT_DOCKER=1); skips, saying why, only when no
// engine answers.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/support/compose_project.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"
#include "tests/support/synthetic.h"
#include "tests/support/training_job.h"

namespace shardopt::testing {
namespace {

constexpr char kModel[] = "adamw";
constexpr uint32_t kShards = 2;
constexpr uint32_t kTrainers = 2;
constexpr char kTag[] = "compose-test";

// Whether the suite can run: the engine check and the image build, once.
struct SuiteState {
  std::string skip_reason;  // Non-empty: no engine answers.
  std::string failure;      // Non-empty: it cannot run, and that is a failure.
};
SuiteState* suite = nullptr;

SuiteState CheckEngineAndBuildImages() {
  SuiteState state;
  const char* reported = getenv("SHARDOPT_DOCKER");
  const std::string why = DockerEngineUnavailable();
  if (!why.empty()) {
    if (reported != nullptr && std::string(reported) == "1") {
      state.failure = "SHARDOPT_DOCKER=1 says an engine is up, but none answers: " + why;
    } else {
      const char* run_tests_why = getenv("SHARDOPT_DOCKER_WHY");
      state.skip_reason =
          absl::StrCat("no Docker engine answers (", why, ")", run_tests_why != nullptr ? "; " : "",
                       run_tests_why != nullptr ? run_tests_why : "");
    }
    return state;
  }
  if (FindSystemTool("docker-compose").empty()) {
    state.failure =
        "an engine answers but there is no docker-compose (apt-get install docker-compose)";
    return state;
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> built = RunBounded(
      absl::StrCat(Runfile("deploy/docker/build_images.sh"),
                   " --server_bin=", Runfile("server/shardopt_server"),
                   " --ctl_bin=", Runfile("tools/ctl/shardoptctl"),
                   " --mlp_trainer_bin=", Runfile("tools/train/mlp_trainer"),
                   " --test_trainer_bin=", Runfile("tests/test_trainer"), " --tag=", kTag),
      absl::Seconds(240));
  if (!built.ok()) {
    state.failure = absl::StrCat("building the images: ", built.status().message());
  } else {
    fprintf(stderr, "[test] images built in %s:\n%s",
            absl::FormatDuration(absl::Now() - start).c_str(), built->c_str());
  }
  return state;
}

// One case's job: its compose project, where the trainers write, and how
// long it trains.
struct Job {
  std::unique_ptr<ComposeProject> project;
  std::string net_prefix;  // First three octets of the project's subnet.
  std::string out_root;    // out_root/rank<r> is trainer r's /out.
  int steps = 0;
  std::vector<std::string> shard_containers;  // Their ids, in shard order.

  std::string ShardAddress(uint32_t i) const {
    return absl::StrCat(net_prefix, ".", 10 + i, ":50051");
  }
};

class ComposeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { suite = new SuiteState(CheckEngineAndBuildImages()); }

  static void TearDownTestSuite() {
    if (suite->skip_reason.empty()) {
      (void)RunBounded(absl::StrCat(FindSystemTool("docker"), " rmi shardopt-server:", kTag,
                                    " shardopt-trainer:", kTag, " shardopt-prometheus:", kTag,
                                    " shardopt-runtime:", kTag),
                       absl::Seconds(60));
    }
    delete suite;
    suite = nullptr;
  }

  void SetUp() override {
    if (!suite->skip_reason.empty()) GTEST_SKIP() << suite->skip_reason;
    ASSERT_TRUE(suite->failure.empty()) << suite->failure;
  }

  void TearDown() override {
    if (HasFailure() && job_.project != nullptr) {
      for (const char* service : {"shard0", "shard1", "trainer0", "trainer1"}) {
        fprintf(stderr, "[test] ---- log of %s ----\n%s", service,
                job_.project->Logs(service).c_str());
      }
    }
    job_.project.reset();  // down -v, failure or not.
  }

  // Starts the job of project `name` on subnet 172.29.<subnet>.0/24: `steps`
  // steps, each at least `step_time` long, so that the case's events land
  // mid-run; periodic checkpoints every `checkpoint_every` steps. Calls whose attempt takes 2 s are
  // retried for a minute; push streams silent for 2 s are dropped by the shard (so a stream cut off
  // by a network disconnect does not hold the trainer's slot).
  // With `monitored`, docker-compose.monitoring.yml's Prometheus comes up
  // with it.
  void StartJob(const std::string& name, int subnet, int steps, absl::Duration step_time,
                int checkpoint_every = 10, bool monitored = false) {
    job_.net_prefix = absl::StrCat("172.29.", subnet);
    job_.out_root = MakeTempDir(name);
    job_.steps = steps;
    for (uint32_t r = 0; r < kTrainers; ++r) {
      ASSERT_EQ(system(absl::StrCat("mkdir -p ", job_.out_root, "/rank", r).c_str()), 0);
    }
    std::vector<std::string> files = {Runfile("deploy/docker-compose.yml")};
    if (monitored) files.push_back(Runfile("deploy/docker-compose.monitoring.yml"));
    job_.project = std::make_unique<ComposeProject>(
        "shardopt_compose_" + name, files,
        std::map<std::string, std::string>{
            {"SHARDOPT_PROMETHEUS_IMAGE", absl::StrCat("shardopt-prometheus:", kTag)},
            {"SHARDOPT_SERVER_IMAGE", absl::StrCat("shardopt-server:", kTag)},
            {"SHARDOPT_TRAINER_IMAGE", absl::StrCat("shardopt-trainer:", kTag)},
            {"SHARDOPT_NET_PREFIX", job_.net_prefix},
            {"SHARDOPT_CHECKPOINT_EVERY", absl::StrCat(checkpoint_every)},
            {"SHARDOPT_STREAM_IDLE_TIMEOUT_S", "2"},
            {"SHARDOPT_TRAINER", "/usr/local/bin/test_trainer"},
            {"SHARDOPT_STEPS", absl::StrCat(steps)},
            {"SHARDOPT_TRAINER_ARGS",
             absl::StrCat("--models=", kModel, " --seed=", kJobSeed,
                          " --out_dir=/out --chunk_bytes=4096 --rpc_timeout=2s"
                          " --retry_budget=60s --min_step_time=",
                          absl::FormatDuration(step_time))},
            {"SHARDOPT_OUT0", job_.out_root + "/rank0"},
            {"SHARDOPT_OUT1", job_.out_root + "/rank1"},
        });
    const absl::Time start = absl::Now();
    absl::Status up = job_.project->Up();
    ASSERT_TRUE(up.ok()) << "bringing the project up (shards healthy, trainers started): " << up;
    // Every container id now, so that the events later land on time.
    for (const char* service : {"shard0", "shard1", "trainer0", "trainer1"}) {
      absl::StatusOr<std::string> id = job_.project->Container(service);
      ASSERT_TRUE(id.ok()) << id.status();
      if (absl::StartsWith(service, "shard")) job_.shard_containers.push_back(*id);
    }
    fprintf(stderr, "[test] %s up in %s\n", name.c_str(),
            absl::FormatDuration(absl::Now() - start).c_str());
  }

  // Waits (bounded: 60 s) until the job passes `version` on `shard`; its
  // version then, which must leave the case room to act mid-run. A trainer
  // that exits meanwhile ends the wait (and the case) at once.
  int64_t AwaitMidRun(uint32_t shard, int64_t version) {
    const absl::Time give_up = absl::Now() + absl::Seconds(60);
    absl::Time next_look = absl::Now();
    int64_t seen = VersionOn(job_.ShardAddress(shard), kModel);
    while (seen < version) {
      if (absl::Now() >= give_up) {
        ADD_FAILURE() << "the job did not reach version " << version << " on shard " << shard
                      << " within 60 s (it is at " << seen << ")";
        return seen;
      }
      if (absl::Now() >= next_look) {
        for (const char* trainer : {"trainer0", "trainer1"}) {
          absl::StatusOr<std::string> state = job_.project->Inspect(trainer, "{{.State.Status}}");
          if (state.ok() && *state != "running") {
            ADD_FAILURE() << trainer << " is " << *state << " while the job is at " << seen
                          << " on shard " << shard << " (waiting for " << version << ")";
            return seen;
          }
        }
        next_look = absl::Now() + absl::Seconds(1);
      }
      absl::SleepFor(absl::Milliseconds(2));
      seen = VersionOn(job_.ShardAddress(shard), kModel);
    }
    EXPECT_LT(seen, job_.steps - 20) << "the job ran too fast for the event to land mid-run";
    return seen;
  }

  // Both trainers exit 0, every shard applied each step once, and both
  // trainers hold the reference parameters.
  void ExpectExactlyOnceAndReference() {
    for (uint32_t r = 0; r < kTrainers; ++r) {
      absl::StatusOr<int> rc =
          job_.project->AwaitExit(absl::StrCat("trainer", r), absl::Seconds(180));
      ASSERT_TRUE(rc.ok()) << "waiting for trainer " << r << " to finish: " << rc.status();
      ASSERT_EQ(*rc, 0) << "trainer " << r << " failed";
    }
    for (uint32_t i = 0; i < kShards; ++i) {
      v1::InspectResponse info;
      const grpc::Status s = RawInspect(*NewStub(job_.ShardAddress(i)), kModel, &info, 10);
      ASSERT_TRUE(s.ok()) << "Inspect of shard " << i << " at " << job_.ShardAddress(i) << ": "
                          << s.error_message();
      EXPECT_EQ(info.version(), job_.steps) << "shard " << i;
      EXPECT_EQ(info.optimizer_steps(), job_.steps)
          << "shard " << i << " applied a step twice or not at all";
    }
    ExpectMatchesReference(kModel, kShards, kTrainers, job_.steps, job_.out_root);
  }

  int64_t Replayed() {
    return TrainerCount(job_.out_root, 0, kModel, "replayed") +
           TrainerCount(job_.out_root, 1, kModel, "replayed");
  }

  // Attempts of both trainers to shard `i` that failed (unreachable, late).
  float FailedAttemptsTo(uint32_t i) {
    float sum = 0;
    for (uint32_t r = 0; r < kTrainers; ++r) {
      absl::StatusOr<std::vector<float>> failed =
          ReadFloats(absl::StrCat(job_.out_root, "/rank", r, "/", kModel, ".failed_attempts"));
      EXPECT_TRUE(failed.ok()) << failed.status();
      if (failed.ok() && failed->size() == kShards) sum += (*failed)[i];
    }
    return sum;
  }

  Job job_;
};

// What docker-compose.monitoring.yml's Prometheus answers to `query` (its
// HTTP API, from this host over the network's bridge): the first result's
// value, "none" when there is none yet, or the error.
absl::StatusOr<std::string> PrometheusQuery(const std::string& net_prefix,
                                            const std::string& query) {
  static const char kScript[] =
      "import json, sys, urllib.parse, urllib.request\n"
      "url = sys.argv[1] + urllib.parse.quote(sys.argv[2])\n"
      "result = json.load(urllib.request.urlopen(url, timeout=5))['data']['result']\n"
      "print(result[0]['value'][1] if result else 'none', end='')\n";
  return RunBounded(absl::StrCat("/usr/bin/python3 -c ", ShellQuote(kScript), " ",
                                 ShellQuote(absl::StrCat("http://", net_prefix,
                                                         ".30:9090/api/v1/query?query=")),
                                 " ", ShellQuote(query)),
                    absl::Seconds(15));
}

// The shards serve metrics, and the Prometheus of
// deploy/docker-compose.monitoring.yml (Debian's, in a container of the
// job's network, deploy/prometheus.yml's scrape configuration) scrapes
// both by service name: it has both targets up and, once the job ended,
// each shard's model at the last step, with the steps each applied.
TEST_F(ComposeTest, PrometheusWatchesTheJob) {
  ASSERT_EQ(access("/usr/bin/prometheus", X_OK), 0)
      << "no /usr/bin/prometheus to build the shardopt-prometheus image from: apt-get install "
         "prometheus (tools/setup.sh does)";
  ASSERT_NO_FATAL_FAILURE(
      StartJob("monitored", 16, 40, absl::Milliseconds(10), 10, /*monitored=*/true));
  ExpectExactlyOnceAndReference();
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"count(up{job=\"shardopt\"} == 1)", "2"},
      {absl::StrCat("min(shardopt_model_version{model=\"", kModel, "\"})"),
       absl::StrCat(job_.steps)},
      {absl::StrCat("sum(shardopt_steps_applied_total{model=\"", kModel, "\"})"),
       absl::StrCat(kShards * job_.steps)},
  };
  // (It scrapes every 5 s.)
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  for (const auto& [query, value] : expected) {
    absl::StatusOr<std::string> answer = PrometheusQuery(job_.net_prefix, query);
    while ((!answer.ok() || *answer != value) && absl::Now() < give_up) {
      absl::SleepFor(absl::Seconds(1));
      answer = PrometheusQuery(job_.net_prefix, query);
    }
    ASSERT_TRUE(answer.ok()) << "asking Prometheus for " << query << ": " << answer.status()
                             << "\n" << job_.project->Logs("prometheus");
    EXPECT_EQ(*answer, value) << "Prometheus's " << query << " after 60 s\n"
                              << job_.project->Logs("prometheus");
  }
}

TEST_F(ComposeTest, JobAcrossContainersMatchesTheReference) {
  ASSERT_NO_FATAL_FAILURE(StartJob("job", 11, 60, absl::Milliseconds(10)));
  ExpectExactlyOnceAndReference();
  EXPECT_EQ(Replayed(), 0) << "nothing was restarted, yet steps were re-pushed";
}

// Every container of a running job ends on SIGTERM: the shards exit 0, the
// trainers (under docker's init) die of the signal; none waits out its
// stop_grace_period (shards 6 s, trainers 2 s) to be killed.
TEST_F(ComposeTest, StopAndDownOfARunningJobTakeSeconds) {
  ASSERT_NO_FATAL_FAILURE(StartJob("stop", 15, 1000, absl::Milliseconds(40)));
  AwaitMidRun(0, 5);
  if (HasFailure()) return;  // The job is not running (the log says why).
  const absl::Time start = absl::Now();
  absl::StatusOr<std::string> stopped = job_.project->Compose("stop");
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_LT(took, absl::Seconds(5)) << "stop waited out a grace period:\n" << *stopped;
  for (const char* service : {"shard0", "shard1"}) {
    absl::StatusOr<int> rc = job_.project->AwaitExit(service, absl::Seconds(5));
    ASSERT_TRUE(rc.ok()) << rc.status();
    EXPECT_EQ(*rc, 0) << service << " did not exit cleanly on SIGTERM";
  }
  for (const char* service : {"trainer0", "trainer1"}) {
    absl::StatusOr<int> rc = job_.project->AwaitExit(service, absl::Seconds(5));
    ASSERT_TRUE(rc.ok()) << rc.status();
    EXPECT_EQ(*rc, 128 + 15) << service << " did not end by SIGTERM (137: killed after its grace)";
  }
  const absl::Time down_start = absl::Now();
  absl::StatusOr<std::string> down = job_.project->Compose("down -v");
  const absl::Duration down_took = absl::Now() - down_start;
  ASSERT_TRUE(down.ok()) << down.status();
  EXPECT_LT(down_took, absl::Seconds(5)) << *down;
  fprintf(stderr, "[test] stop of the running job took %s, down -v %s\n",
          absl::FormatDuration(took).c_str(), absl::FormatDuration(down_took).c_str());
}

// The version a shard's log says it restored the model at, or -1.
int64_t RestoredVersion(const std::string& log) {
  const std::string marker = absl::StrCat("restored model '", kModel, "' at version ");
  const size_t at = log.find(marker);
  int64_t version = -1;
  if (at == std::string::npos) return -1;
  const std::string rest = log.substr(at + marker.size());
  if (!absl::SimpleAtoi(rest.substr(0, rest.find(' ')), &version)) return -1;
  return version;
}

TEST_F(ComposeTest, KilledShardRestartsFromItsCheckpointVolume) {
  // Checkpoints at 0, 25, 50, ...: killed between 28 and 50, the shard
  // comes back from step 25, behind the other one.
  ASSERT_NO_FATAL_FAILURE(StartJob("kill", 12, 150, absl::Milliseconds(40), 25));
  AwaitMidRun(1, 28);
  if (HasFailure()) return;
  absl::StatusOr<std::string> killed =
      job_.project->Docker("kill " + job_.shard_containers[0]);  // SIGKILL
  ASSERT_TRUE(killed.ok()) << killed.status();
  const int64_t at = VersionOn(job_.ShardAddress(1), kModel);
  absl::StatusOr<int> rc = job_.project->AwaitExit("shard0", absl::Seconds(10));
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(*rc, 137) << "shard0 was not SIGKILLed";
  absl::SleepFor(absl::Seconds(1));
  // (A step both trainers had pushed to shard 1 before the kill may end.)
  const int64_t held = VersionOn(job_.ShardAddress(1), kModel);
  EXPECT_LE(held, at + 1) << "the job went on without shard 0";
  absl::StatusOr<std::string> started = job_.project->Compose("start shard0");
  ASSERT_TRUE(started.ok()) << started.status();
  fprintf(stderr, "[test] shard0 killed at version %lld, restarted with shard 1 at %lld\n",
          static_cast<long long>(at), static_cast<long long>(held));
  ExpectExactlyOnceAndReference();
  const int64_t restored = RestoredVersion(job_.project->Logs("shard0"));
  fprintf(stderr, "[test] shard0 restored version %lld; %lld pushes re-sent\n",
          static_cast<long long>(restored), static_cast<long long>(Replayed()));
  ASSERT_GE(restored, 0) << "shard0 did not restore from the checkpoint volume";
  EXPECT_EQ(restored % 25, 0) << "not a periodic checkpoint's step";
  if (restored < at) {
    EXPECT_GT(Replayed(), 0) << "shard0 came back at " << restored << ", behind shard 1 at " << at
                             << ", yet nothing was re-pushed";
  } else {
    ADD_FAILURE() << "killed too late (at " << at
                  << "): the checkpoint it restored held every step, nothing to re-push";
  }
}

TEST_F(ComposeTest, DisconnectedShardRejoinsAtItsAddressAndTheJobResumes) {
  ASSERT_NO_FATAL_FAILURE(StartJob("partition", 13, 200, absl::Milliseconds(40)));
  const std::string ip = job_.net_prefix + ".11";
  const std::string& id = job_.shard_containers[1];
  const int64_t at = AwaitMidRun(0, 20);
  if (HasFailure()) return;
  absl::StatusOr<std::string> cut =
      job_.project->Docker(absl::StrCat("network disconnect ", job_.project->Network(), " ", id));
  ASSERT_TRUE(cut.ok()) << cut.status();
  // Longer than the calls' 2 s attempts and the shard's 2 s stream timeout.
  absl::SleepFor(absl::Milliseconds(500));
  const int64_t held = VersionOn(job_.ShardAddress(0), kModel);
  absl::SleepFor(absl::Milliseconds(4500));
  const int64_t during = VersionOn(job_.ShardAddress(0), kModel);
  absl::StatusOr<std::string> healed = job_.project->Docker(
      absl::StrCat("network connect --ip ", ip, " ", job_.project->Network(), " ", id));
  ASSERT_TRUE(healed.ok()) << healed.status();
  fprintf(stderr, "[test] shard1 cut off at version %lld for 5 s: the job at %lld, then %lld\n",
          static_cast<long long>(at), static_cast<long long>(held), static_cast<long long>(during));
  EXPECT_LE(during, held + 1) << "the job went on without shard 1";
  absl::StatusOr<std::string> address =
      job_.project->Inspect("shard1", absl::StrCat("{{(index .NetworkSettings.Networks \"",
                                                   job_.project->Network(), "\").IPAddress}}"));
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_EQ(*address, ip) << "shard1 came back at another address";
  ExpectExactlyOnceAndReference();
  EXPECT_GT(FailedAttemptsTo(1), 0) << "no call to the cut-off shard failed or timed out";
  EXPECT_EQ(Replayed(), 0) << "shard 1 kept running: nothing had to be re-pushed";
}

TEST_F(ComposeTest, RollingRestartOfEveryShard) {
  ASSERT_NO_FATAL_FAILURE(StartJob("rolling", 14, 250, absl::Milliseconds(40)));
  int64_t next = 20;
  for (uint32_t i = 0; i < kShards; ++i) {
    const std::string service = absl::StrCat("shard", i);
    const uint32_t other = 1 - i;
    const int64_t at = AwaitMidRun(other, next);
    if (HasFailure()) return;
    // SIGTERM; the compose file's stop_grace_period (6 s) bounds it.
    const absl::Time start = absl::Now();
    absl::StatusOr<std::string> stopped = job_.project->Compose("stop " + service);
    const absl::Duration took = absl::Now() - start;
    ASSERT_TRUE(stopped.ok()) << stopped.status();
    absl::StatusOr<int> rc = job_.project->AwaitExit(service, absl::Seconds(10));
    ASSERT_TRUE(rc.ok()) << rc.status();
    EXPECT_EQ(*rc, 0) << service << " did not shut down cleanly on SIGTERM";
    EXPECT_LT(took, absl::Seconds(5)) << service << " took its whole grace period to stop";
    absl::StatusOr<std::string> started = job_.project->Compose("start " + service);
    ASSERT_TRUE(started.ok()) << started.status();
    absl::Status healthy = job_.project->AwaitHealthy(service, absl::Seconds(60));
    ASSERT_TRUE(healthy.ok()) << healthy;
    fprintf(stderr, "[test] %s restarted at version %lld (stopped in %s)\n", service.c_str(),
            static_cast<long long>(at), absl::FormatDuration(took).c_str());
    next = VersionOn(job_.ShardAddress(other), kModel) + 15;
  }
  ExpectExactlyOnceAndReference();
  for (uint32_t i = 0; i < kShards; ++i) {
    EXPECT_GE(RestoredVersion(job_.project->Logs(absl::StrCat("shard", i))), 0)
        << "shard" << i << " did not restore from the checkpoint volume";
  }
}

}  // namespace
}  // namespace shardopt::testing
