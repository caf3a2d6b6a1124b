#include "server/metrics.h"

#include <string>

#include "gtest/gtest.h"
#include "server/metrics_page.h"

namespace shardopt {
namespace {

bool HasLine(const std::string& page, const std::string& line) {
  return page.find("\n" + line + "\n") != std::string::npos;
}

TEST(MetricsTest, CallsAreCountedByServiceMethodAndCodeWithLatency) {
  ServerMetrics metrics;
  metrics.RecordCall("/shardopt.v1.ShardService/PushGradients", "OK", 0.003);
  metrics.RecordCall("/shardopt.v1.ShardService/PushGradients", "OK", 0.2);
  metrics.RecordCall("/shardopt.v1.ShardService/PushGradients", "INVALID_ARGUMENT", 0.00001);
  const std::string page = RenderMetricsPage(metrics.Read(), ServerGauges{}, {});
  const std::string method = R"(service="shardopt.v1.ShardService",method="PushGradients")";
  EXPECT_TRUE(HasLine(page, "shardopt_rpc_handled_total{" + method + R"(,code="OK"} 2)")) << page;
  EXPECT_TRUE(
      HasLine(page, "shardopt_rpc_handled_total{" + method + R"(,code="INVALID_ARGUMENT"} 1)"));
  // Buckets are cumulative: 1e-5 in the first, 0.003 by 0.005, 0.2 by 0.25.
  EXPECT_TRUE(
      HasLine(page, "shardopt_rpc_duration_seconds_bucket{" + method + R"(,le="0.0001"} 1)"))
      << page;
  EXPECT_TRUE(
      HasLine(page, "shardopt_rpc_duration_seconds_bucket{" + method + R"(,le="0.0025"} 1)"));
  EXPECT_TRUE(HasLine(page, "shardopt_rpc_duration_seconds_bucket{" + method + R"(,le="0.005"} 2)"))
      << page;
  EXPECT_TRUE(HasLine(page, "shardopt_rpc_duration_seconds_bucket{" + method + R"(,le="0.25"} 3)"));
  EXPECT_TRUE(HasLine(page, "shardopt_rpc_duration_seconds_bucket{" + method + R"(,le="+Inf"} 3)"));
  EXPECT_TRUE(HasLine(page, "shardopt_rpc_duration_seconds_count{" + method + "} 3"));
}

// A checkpoint part of a few GiB to a shared filesystem takes minutes: its
// buckets reach 30 min (the shutdown grace period is sized from them),
// where the calls' latency buckets stop at 60 s.
TEST(MetricsTest, CheckpointWritesHaveBucketsOfMinutes) {
  ServerMetrics metrics;
  metrics.RecordCheckpoint("m", true, 0.05);
  metrics.RecordCheckpoint("m", true, 95);
  metrics.RecordCheckpoint("m", true, 1500);
  metrics.RecordCheckpoint("m", false, 3);
  const std::string page = RenderMetricsPage(metrics.Read(), ServerGauges{}, {});
  const std::string bucket = R"(shardopt_checkpoint_write_seconds_bucket{model="m",le=)";
  EXPECT_TRUE(HasLine(page, bucket + R"("0.1"} 1)")) << page;
  EXPECT_TRUE(HasLine(page, bucket + R"("60"} 1)")) << page;
  EXPECT_TRUE(HasLine(page, bucket + R"("120"} 2)")) << page;
  EXPECT_TRUE(HasLine(page, bucket + R"("1800"} 3)")) << page;
  EXPECT_TRUE(HasLine(page, bucket + R"("+Inf"} 3)")) << page;
  EXPECT_TRUE(HasLine(page, R"(shardopt_checkpoints_total{model="m",result="failed"} 1)")) << page;
}

TEST(MetricsTest, PushesRefusedAndAbandonedArePerTrainer) {
  ServerMetrics metrics;
  metrics.RecordPush("mlp", 0, "accepted");
  metrics.RecordPush("mlp", 1, "applied");
  metrics.RecordPushRefused("mlp", 1, "ABORTED");
  metrics.RecordPushAbandoned("mlp", 1);
  metrics.RecordPushAbandoned("mlp", 1);
  const std::string page = RenderMetricsPage(metrics.Read(), ServerGauges{}, {});
  EXPECT_TRUE(
      HasLine(page, R"(shardopt_pushes_total{model="mlp",trainer="0",outcome="accepted"} 1)"));
  EXPECT_TRUE(
      HasLine(page, R"(shardopt_pushes_total{model="mlp",trainer="1",outcome="applied"} 1)"));
  EXPECT_TRUE(
      HasLine(page, R"(shardopt_pushes_refused_total{model="mlp",trainer="1",code="ABORTED"} 1)"));
  EXPECT_TRUE(HasLine(page, R"(shardopt_pushes_abandoned_total{model="mlp",trainer="1"} 2)"));
}

TEST(MetricsTest, ModelGaugesAndTrainerLag) {
  ModelGauges m;
  m.model_id = "mlp";
  m.version = 12;
  m.steps_applied = 11;  // The model's (restored at 8).
  m.steps_skipped = 1;
  m.steps_applied_here = 3;  // This server's.
  m.steps_skipped_here = 0;
  m.gradient_bytes_received = 4096;
  m.loss_scale = 65536;
  m.trainers = {TrainerGauges{12, 0.5}, TrainerGauges{9, 3.0}};
  ServerGauges server;
  server.shard_index = 1;
  server.shard_count = 2;
  server.device = "cpu";
  const std::string page = RenderMetricsPage(ServerMetrics().Read(), server, {m});
  EXPECT_TRUE(
      HasLine(page, R"(shardopt_shard_info{shard_index="1",shard_count="2",device="cpu"} 1)"));
  EXPECT_TRUE(HasLine(page, R"(shardopt_model_version{model="mlp"} 12)"));
  EXPECT_TRUE(HasLine(page, R"(shardopt_steps_applied_total{model="mlp"} 3)"));
  EXPECT_TRUE(HasLine(page, R"(shardopt_steps_skipped_total{model="mlp"} 0)"));
  EXPECT_TRUE(HasLine(page, R"(shardopt_model_optimizer_steps{model="mlp"} 11)"));
  EXPECT_TRUE(HasLine(page, R"(shardopt_model_skipped_steps{model="mlp"} 1)"));
  EXPECT_TRUE(HasLine(page, R"(shardopt_gradient_bytes_received_total{model="mlp"} 4096)"));
  EXPECT_TRUE(HasLine(page, R"(shardopt_loss_scale{model="mlp"} 65536)"));
  EXPECT_TRUE(HasLine(page, R"(shardopt_trainer_last_pushed_step{model="mlp",trainer="1"} 9)"));
  EXPECT_TRUE(HasLine(page, R"(shardopt_trainer_lag_steps{model="mlp",trainer="0"} 0)"));
  EXPECT_TRUE(HasLine(page, R"(shardopt_trainer_lag_steps{model="mlp",trainer="1"} 3)"));
}

TEST(MetricsTest, LabelValuesAreEscaped) {
  EXPECT_EQ(Label("path", "a\"b\\c\nd"), R"(path="a\"b\\c\nd")");
}

}  // namespace
}  // namespace shardopt
