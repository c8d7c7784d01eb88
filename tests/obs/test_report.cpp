// The run report without a browser: reading metrics.jsonl, the terminal summary, and what the page holds.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "crosstrain/core/error.h"
#include "crosstrain/obs/report.h"
#include "synthetic_run.h"
#include "scratch.h"

using crosstrain::UsageError;
using namespace crosstrain::obs;
namespace fs = std::filesystem;

namespace {

fs::path synthetic_run(const std::string& name, int steps, bool traces) {
  const fs::path dir = crosstrain::testing::scratch_path("report-" + name);
  crosstrain::testing::write_synthetic_run(dir, steps, traces);
  return dir;
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST(ReportMetrics, DropsATornLastRowAndNamesTheLineOfGarbage) {
  EXPECT_EQ(parse_metrics_text("{\"step\":1}\n{\"step\":2}\n{\"step\":3,\"lo", "m").size(), 2u);
  EXPECT_EQ(parse_metrics_text("{\"step\":1}\n\n{\"step\":2}\n\n", "m").size(), 2u);
  try {
    parse_metrics_text("{\"step\":1}\nstep 2 | loss 3\n{\"step\":3}\n", "metrics.jsonl");
    FAIL() << "expected a UsageError";
  } catch (const UsageError& e) {
    EXPECT_TRUE(has(e.what(), "metrics.jsonl:2:")) << e.what();
  }
}

TEST(ReportMetrics, HeadlineFigures) {
  std::vector<nlohmann::json> rows;
  for (int s = 1; s <= 10; ++s) rows.push_back(crosstrain::testing::metrics_row(s));
  const RunFigures f = run_figures(rows);
  EXPECT_EQ(f.last_step, 10);
  EXPECT_DOUBLE_EQ(*f.final_loss, 4.0);
  EXPECT_DOUBLE_EQ(*f.final_val_loss, 4.1);
  EXPECT_EQ(f.final_val_step, 10);
  EXPECT_DOUBLE_EQ(*f.tokens_per_s, 1005.5);  // median of 1001..1010
  EXPECT_EQ(f.sync_mode, "diloco");
  EXPECT_DOUBLE_EQ(*f.wan_bytes, 10 * 1048576.0);
  EXPECT_DOUBLE_EQ(*f.staleness_mean, 0.5);
}

// Per step (synthetic_run.h): compute 70 ms, exposed 15 ms, idle 15 ms; comm 45 ms, overlap 1 - 15/45.
TEST(ReportSummary, TextForATracedRun) {
  const RunData run = load_run(synthetic_run("report_summary", 10, true).string());
  EXPECT_EQ(report_summary_text(run),
            "steps: 10 (10 metrics rows) | final loss 4.0000 | val loss 4.1000 (step 10)\n"
            "throughput: 1006 tokens/s | MFU 1.00% (medians over steps) | sync diloco | wide-area 10.0 MiB | "
            "staleness 0.50\n"
            "rank 0: compute 70.0% | exposed comm 15.0% | idle 15.0% of 100.0 ms/step (10 steps traced)\n"
            "rank 1: compute 70.0% | exposed comm 15.0% | idle 15.0% of 100.0 ms/step (10 steps traced)\n"
            "overlap: 66.7% of communication hidden behind compute | pipeline bubble: n/a (pp = 1)\n"
            "straggler: none (busiest: rank 0 at 1.00x the median)\n");
}

TEST(ReportSummary, MetricsAloneSayNoTraces) {
  const RunData run = load_run(synthetic_run("report_no_traces", 4, false).string());
  EXPECT_FALSE(run.trace);
  const std::string text = report_summary_text(run);
  EXPECT_TRUE(has(text, "traces: no traces: ")) << text;
  EXPECT_TRUE(has(text, "obs.trace = true")) << text;
  const std::string html = report_html(run, "/* chart.js */");
  EXPECT_TRUE(has(html, "id=\"no-traces\"")) << html;
  EXPECT_FALSE(has(html, "chart-time_split"));
  EXPECT_TRUE(has(html, "chart-loss"));
}

TEST(ReportSummary, NothingToReportIsAUsageError) {
  const fs::path empty = fs::path(::testing::TempDir()) / "report_empty";
  fs::remove_all(empty);
  fs::create_directories(empty);
  EXPECT_THROW(load_run(empty.string()), UsageError);
  EXPECT_THROW(load_run((empty / "absent").string()), UsageError);
}

TEST(ReportPage, HoldsEveryChartAndTableAndNoNetworkReference) {
  const RunData run = load_run(synthetic_run("report_page", 10, true).string());
  const std::string html = report_html(run, "/* chart.js */");
  for (const char* id : {"chart-loss", "chart-throughput", "chart-time_split", "chart-memory", "chart-wan",
                         "chart-staleness", "id=\"summary\"", "id=\"ranks\"", "id=\"stragglers\"",
                         "data-status=\"loading\"", "Content-Security-Policy"})
    EXPECT_TRUE(has(html, id)) << id;
  for (const char* network : {"http:", "https:", "src=", "href=", "@import", "url("})
    EXPECT_FALSE(has(html, network)) << network;
}

TEST(ReportPage, JsonCannotCloseTheScriptEarly) {
  RunData run;
  run.run_dir = "</script><b>";
  run.metrics = {crosstrain::testing::metrics_row(1)};
  run.metrics[0]["sync_mode"] = "</script>";
  const std::string html = report_html(run, "var s = '</script>';");
  // The only closing tags are those of the three script elements.
  size_t count = 0;
  for (size_t at = html.find("</script>"); at != std::string::npos; at = html.find("</script>", at + 1)) ++count;
  EXPECT_EQ(count, 3u);
}

TEST(ReportPage, MissingChartJsSaysWhatToInstall) {
  try {
    chart_js_source("/nonexistent/chart.min.js");
    FAIL() << "expected a UsageError";
  } catch (const UsageError& e) {
    EXPECT_TRUE(has(e.what(), "apt-get install libjs-chart.js")) << e.what();
  }
}
