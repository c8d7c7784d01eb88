// The Prometheus text of a step's metrics (obs/metrics_server.h): exact lines, escaping, values that are not finite.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "crosstrain/obs/metrics_server.h"
#include "http_get.h"

namespace crosstrain::obs {
namespace {

StepMetrics small_step() {
  StepMetrics m;
  m.step = 7;
  m.total_steps = 40;
  m.loss = 2.5;
  m.lr = 0.001;
  m.grad_norm = 0.75;
  m.tokens_per_s = 1234.5;
  m.mfu = 0.0125;
  m.step_time_s = 0.08;
  m.comm_time_s = 0.012;
  m.exposed_comm_time_s = 0.003;
  return m;
}

TEST(PrometheusText, BeforeAnyStepOnlyUp) {
  EXPECT_EQ(prometheus_up_text(),
            "# HELP crosstrain_up 1 while the training job serves metrics.\n"
            "# TYPE crosstrain_up gauge\n"
            "crosstrain_up 1\n");
}

TEST(PrometheusText, FixedFieldsExactly) {
  EXPECT_EQ(prometheus_text(small_step()),
            prometheus_up_text() +
                "# HELP crosstrain_step The last completed training step.\n"
                "# TYPE crosstrain_step gauge\n"
                "crosstrain_step 7\n"
                "# HELP crosstrain_total_steps train.steps: the step the run ends at.\n"
                "# TYPE crosstrain_total_steps gauge\n"
                "crosstrain_total_steps 40\n"
                "# HELP crosstrain_loss Training loss of the last step.\n"
                "# TYPE crosstrain_loss gauge\n"
                "crosstrain_loss 2.5\n"
                "# HELP crosstrain_lr Learning rate of the last step.\n"
                "# TYPE crosstrain_lr gauge\n"
                "crosstrain_lr 0.001\n"
                "# HELP crosstrain_grad_norm Gradient norm of the last step (before clipping).\n"
                "# TYPE crosstrain_grad_norm gauge\n"
                "crosstrain_grad_norm 0.75\n"
                "# HELP crosstrain_tokens_per_second Tokens per second over all ranks in the last step.\n"
                "# TYPE crosstrain_tokens_per_second gauge\n"
                "crosstrain_tokens_per_second 1234.5\n"
                "# HELP crosstrain_mfu Model FLOPs utilization of the last step (0..1) against the measured "
                "per-thread GEMM peak.\n"
                "# TYPE crosstrain_mfu gauge\n"
                "crosstrain_mfu 0.0125\n"
                "# HELP crosstrain_step_seconds Wall time of the last step.\n"
                "# TYPE crosstrain_step_seconds gauge\n"
                "crosstrain_step_seconds 0.08\n"
                "# HELP crosstrain_comm_seconds Communication time of the last step, issue to completion.\n"
                "# TYPE crosstrain_comm_seconds gauge\n"
                "crosstrain_comm_seconds 0.012\n"
                "# HELP crosstrain_exposed_comm_seconds Seconds the training thread waited on communication in the "
                "last step.\n"
                "# TYPE crosstrain_exposed_comm_seconds gauge\n"
                "crosstrain_exposed_comm_seconds 0.003\n");
}

TEST(PrometheusText, ExtraCountsSeriesAndLabels) {
  StepMetrics m = small_step();
  m.val_loss = 2.25;
  m.extra["time_s"] = 1.5;
  m.extra["checkpoint_s"] = 0;
  m.counts["wan_bytes"] = 4096;
  m.counts["peak_rss_bytes"] = 123456789012;
  m.series["straggler_score"] = {1.0, 1.8};
  m.series["rank_busy_s"] = {0.05, 0.09};
  m.labels["sync_mode"] = "sync";
  const std::string text = prometheus_text(m);
  const std::string expected_tail =
      "# HELP crosstrain_checkpoint_seconds The metrics.jsonl field 'checkpoint_s' of the last step.\n"
      "# TYPE crosstrain_checkpoint_seconds gauge\n"
      "crosstrain_checkpoint_seconds 0\n"
      "# HELP crosstrain_elapsed_seconds Seconds since this process began training.\n"
      "# TYPE crosstrain_elapsed_seconds gauge\n"
      "crosstrain_elapsed_seconds 1.5\n"
      "# HELP crosstrain_peak_rss_bytes Peak resident memory of rank 0, in bytes.\n"
      "# TYPE crosstrain_peak_rss_bytes gauge\n"
      "crosstrain_peak_rss_bytes 123456789012\n"
      "# HELP crosstrain_wan_bytes_total Bytes sent over the wide-area links so far.\n"
      "# TYPE crosstrain_wan_bytes_total counter\n"
      "crosstrain_wan_bytes_total 4096\n"
      "# HELP crosstrain_rank_busy_seconds Mean busy seconds per step of each rank, from the last exchange.\n"
      "# TYPE crosstrain_rank_busy_seconds gauge\n"
      "crosstrain_rank_busy_seconds{rank=\"0\"} 0.05\n"
      "crosstrain_rank_busy_seconds{rank=\"1\"} 0.09\n"
      "# HELP crosstrain_straggler_score Busy time of each rank over the median (1: typical), from the last "
      "exchange.\n"
      "# TYPE crosstrain_straggler_score gauge\n"
      "crosstrain_straggler_score{rank=\"0\"} 1\n"
      "crosstrain_straggler_score{rank=\"1\"} 1.8\n"
      "# HELP crosstrain_info Text fields of the run, as labels; always 1.\n"
      "# TYPE crosstrain_info gauge\n"
      "crosstrain_info{sync_mode=\"sync\"} 1\n";
  ASSERT_GE(text.size(), expected_tail.size());
  EXPECT_EQ(text.substr(text.size() - expected_tail.size()), expected_tail);
  EXPECT_NE(text.find("# TYPE crosstrain_val_loss gauge\ncrosstrain_val_loss 2.25\n"), std::string::npos) << text;
}

TEST(PrometheusText, LabelValuesAndHelpAreEscaped) {
  StepMetrics m = small_step();
  m.labels["sync-mode"] = "a\"b\\c\nd";
  m.extra["odd\\key\nx"] = 1;
  const std::string text = prometheus_text(m);
  EXPECT_NE(text.find("crosstrain_info{sync_mode=\"a\\\"b\\\\c\\nd\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("# HELP crosstrain_odd_key_x The metrics.jsonl field 'odd\\\\key\\nx' of the last step.\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("crosstrain_odd_key_x 1\n"), std::string::npos) << text;
}

TEST(PrometheusText, NonFiniteValuesAsPrometheusWritesThem) {
  StepMetrics m = small_step();
  m.loss = std::numeric_limits<double>::quiet_NaN();
  m.tokens_per_s = std::numeric_limits<double>::infinity();
  m.mfu = -std::numeric_limits<double>::infinity();
  const std::string text = prometheus_text(m);
  EXPECT_EQ(testing::sample_value(text, "crosstrain_loss"), "NaN");
  EXPECT_EQ(testing::sample_value(text, "crosstrain_tokens_per_second"), "+Inf");
  EXPECT_EQ(testing::sample_value(text, "crosstrain_mfu"), "-Inf");
}

TEST(PrometheusText, ValuesReadBackExactly) {
  StepMetrics m = small_step();
  for (double v : {0.1, 1.0 / 3.0, 2.718281828459045, 5.551115123125783e-17, 1e300, 123456789.125}) {
    m.loss = v;
    EXPECT_EQ(std::stod(testing::sample_value(prometheus_text(m), "crosstrain_loss")), v);
  }
}

TEST(PrometheusText, GaugesKeepTheirLastKnownValue) {
  StepMetrics before = small_step();
  before.val_loss = 2.0;
  before.series["straggler_score"] = {1.0, 2.0};
  before.counts["straggler_rank"] = 1;
  StepMetrics now = small_step();
  now.step = 8;
  now.counts["wan_bytes"] = 10;
  const StepMetrics merged = with_last_known(now, before);
  EXPECT_EQ(merged.step, 8);
  EXPECT_EQ(merged.val_loss, 2.0);
  EXPECT_EQ(merged.series.at("straggler_score"), (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(merged.counts.at("straggler_rank"), 1);
  EXPECT_EQ(merged.counts.at("wan_bytes"), 10);
  now.val_loss = 3.0;
  now.series["straggler_score"] = {1.5, 1.0};
  const StepMetrics fresh = with_last_known(now, before);
  EXPECT_EQ(fresh.val_loss, 3.0);
  EXPECT_EQ(fresh.series.at("straggler_score"), (std::vector<double>{1.5, 1.0}));
}

}  // namespace
}  // namespace crosstrain::obs
