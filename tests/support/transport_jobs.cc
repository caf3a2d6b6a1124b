#include "tests/support/transport_jobs.h"

#include <stdlib.h>

#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/nccl/loopback_environment.h"
#include "gtest/gtest.h"
#include "tests/support/process.h"
#include "tests/support/training_job.h"

namespace shardopt::testing {
namespace {

std::vector<float> Floats(const std::string& path) {
  absl::StatusOr<std::vector<float>> got = ReadFloats(path);
  EXPECT_TRUE(got.ok()) << got.status();
  return got.ok() ? *got : std::vector<float>{};
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return !a.empty() && a.size() == b.size() &&
         std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

std::string RunTransportJob(const TransportJob& job) {
  if (job.own_nccl_hosts) nccl::UseNcclOverLoopback();
  const auto host_id = [&](const std::string& who) {
    if (job.own_nccl_hosts) setenv("NCCL_HOSTID", absl::StrCat("shardopt-test-", who).c_str(), 1);
  };
  const uint32_t shards = static_cast<uint32_t>(job.server_flags.size());
  std::vector<std::unique_ptr<ServerProcess>> servers;
  for (uint32_t i = 0; i < shards; ++i) {
    host_id(absl::StrCat("shard", i));
    auto server = ServerProcess::Start(i, shards, job.server_flags[i]);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!server.ok()) return "";
    servers.push_back(std::move(*server));
  }
  const std::string root = MakeTempDir("job");
  std::vector<std::unique_ptr<ChildProcess>> procs(job.trainers);
  for (uint32_t r = 0; r < job.trainers; ++r) {
    host_id(absl::StrCat("trainer", r));
    StartTrainer(Addresses(servers), r, job.trainers, job.models, job.steps, root,
                 job.trainer_flags[r], &procs[r]);
  }
  if (job.own_nccl_hosts) unsetenv("NCCL_HOSTID");
  AwaitTrainers(procs);
  return root;
}

void ExpectSameTrainerResults(const std::string& a, const std::string& b, uint32_t trainers,
                              const std::string& models, const std::string& label) {
  for (const absl::string_view name : absl::StrSplit(models, ',')) {
    for (uint32_t r = 0; r < trainers; ++r) {
      for (const char* suffix : {".bin", ".master.bin"}) {
        const std::string file = absl::StrCat("/rank", r, "/", name, suffix);
        EXPECT_TRUE(SameBits(Floats(a + file), Floats(b + file))) << label << ": " << file;
      }
    }
  }
}

}  // namespace shardopt::testing
