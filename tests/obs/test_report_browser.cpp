// The run report as a person sees it: `crosstrain report` and `crosstrain trace merge` as commands, the page opened
// in headless Chromium. A test fails on a console error, on a page whose script did not report every chart built
// with data (body data-status), or on a missing screenshot. The screenshots stay in the build tree.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "chromium.h"
#include "cli_fixture.h"
#include "subprocess.h"
#include "synthetic_run.h"
#include "scratch.h"

namespace fs = std::filesystem;
using namespace crosstrain::testing;

namespace {

const char* const kChromium = "/usr/bin/chromium";

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Lines of Chromium's log that report the page's console errors or uncaught exceptions.
std::string console_errors(const std::string& log) {
  std::istringstream in(log);
  std::string errors;
  for (std::string line; std::getline(in, line);)
    if (contains(line, "CONSOLE") || contains(line, "Uncaught")) errors += line + "\n";
  return errors;
}

std::string body_status(const std::string& dom) {
  const size_t body = dom.find("<body");
  const size_t attr = dom.find("data-status=\"", body);
  if (body == std::string::npos || attr == std::string::npos || attr > dom.find('>', body)) return "(none)";
  const size_t begin = attr + 13;
  return dom.substr(begin, dom.find('"', begin) - begin);
}

// Width and height from a PNG's IHDR chunk (0 when it is not a PNG).
std::pair<uint32_t, uint32_t> png_size(const std::string& png) {
  if (png.size() < 24 || png.compare(1, 3, "PNG") != 0) return {0, 0};
  auto be32 = [&](size_t at) {
    return uint32_t(uint8_t(png[at])) << 24 | uint32_t(uint8_t(png[at + 1])) << 16 |
           uint32_t(uint8_t(png[at + 2])) << 8 | uint32_t(uint8_t(png[at + 3]));
  };
  return {be32(16), be32(20)};
}

// Opens the report twice (DOM, screenshot) and checks both; returns the DOM.
std::string check_in_browser(const fs::path& page, const fs::path& work, const std::string& screenshot_name) {
  const BrowserRun dom = run_chromium("file://" + fs::absolute(page).string(), work, {"--dump-dom"});
  EXPECT_FALSE(dom.process.timed_out) << dom.log;
  EXPECT_EQ(console_errors(dom.log), "") << "console errors in " << page;
  EXPECT_EQ(body_status(dom.dom), "ok") << dom.log;

  const fs::path png = fs::path(CT_SCREENSHOT_DIR) / screenshot_name;
  fs::create_directories(png.parent_path());
  fs::remove(png);
  const BrowserRun shot = run_chromium("file://" + fs::absolute(page).string(), work,
                                      {"--screenshot=" + png.string(), "--window-size=1400,2400"});
  EXPECT_FALSE(shot.process.timed_out) << shot.log;
  EXPECT_EQ(console_errors(shot.log), "");
  const std::string image = read_file(png);
  EXPECT_GT(image.size(), 20000u) << png << " is missing or tiny\n" << shot.log;
  EXPECT_EQ(png_size(image), std::make_pair(uint32_t(1400), uint32_t(2400))) << png;
  return dom.dom;
}

void skip_without_chromium() {
  if (!fs::exists(kChromium))
    GTEST_SKIP() << kChromium << " is absent: apt-get install chromium (the README's test command installs it)";
}

ProcessResult run_crosstrain(const std::vector<std::string>& args, int seconds = 120) {
  std::vector<std::string> argv = {kBin};
  argv.insert(argv.end(), args.begin(), args.end());
  return run_process(argv, {}, std::chrono::seconds(seconds));
}

fs::path work_dir(const std::string& name) { return crosstrain::testing::scratch_dir("report-browser-" + name); }

}  // namespace

TEST(ReportBrowser, SyntheticRunShowsEveryChart) {
  skip_without_chromium();
  const fs::path work = work_dir("report_browser_synthetic");
  const fs::path run = work / "run";
  write_synthetic_run(run, 20);

  const ProcessResult merged = run_crosstrain({"trace", "merge", run.string()});
  ASSERT_EQ(merged.exit_code(), 0) << merged.output;
  EXPECT_TRUE(contains(merged.output, "merged 2 ranks, 288 events")) << merged.output;
  EXPECT_TRUE(fs::exists(run / "traces" / "merged.json"));

  const ProcessResult report = run_crosstrain({"report", run.string()});
  ASSERT_EQ(report.exit_code(), 0) << report.output;
  EXPECT_TRUE(contains(report.output, "rank 1: compute 70.0% | exposed comm 15.0% | idle 15.0%")) << report.output;
  EXPECT_TRUE(contains(report.output, "report: " + (run / "report.html").string())) << report.output;

  const std::string dom = check_in_browser(run / "report.html", work, "report-synthetic.png");
  for (const char* chart : {"chart-loss", "chart-throughput", "chart-time_split", "chart-memory", "chart-wan",
                            "chart-staleness"})
    EXPECT_TRUE(contains(dom, chart)) << chart;
}

TEST(ReportBrowser, MetricsWithoutTracesSaysSo) {
  skip_without_chromium();
  const fs::path work = work_dir("report_browser_metrics_only");
  const fs::path run = work / "run";
  write_synthetic_run(run, 5, false);
  const fs::path out = work / "elsewhere.html";
  const ProcessResult report = run_crosstrain({"report", run.string(), "--out", out.string()});
  ASSERT_EQ(report.exit_code(), 0) << report.output;
  EXPECT_TRUE(contains(report.output, "traces: no traces")) << report.output;
  const std::string dom = check_in_browser(out, work, "report-metrics-only.png");
  EXPECT_TRUE(contains(dom, "id=\"no-traces\""));

  const ProcessResult merged = run_crosstrain({"trace", "merge", run.string()});
  EXPECT_EQ(merged.exit_code(), 2) << merged.output;
  EXPECT_TRUE(contains(merged.output, "obs.trace = true")) << merged.output;
}

// A real run: 2 ranks of the tiny model for 20 steps, with the traces the trainer writes.
TEST(ReportBrowser, RealTwoRankRun) {
  skip_without_chromium();
  const fs::path work = work_dir("report_browser_train");
  const std::string run = (work / "run").string();
  const ProcessResult train = run_process(tiny_args(run, 2, 20), {}, std::chrono::seconds(240));
  ASSERT_EQ(train.exit_code(), 0) << train.output;

  const ProcessResult merged = run_crosstrain({"trace", "merge", run});
  ASSERT_EQ(merged.exit_code(), 0) << merged.output;
  EXPECT_TRUE(contains(merged.output, "merged 2 ranks")) << merged.output;
  const ProcessResult report = run_crosstrain({"report", run});
  ASSERT_EQ(report.exit_code(), 0) << report.output;
  std::printf("%s", report.output.c_str());  // the summary, for the log
  for (const char* line : {"steps: 20", "rank 0: compute", "rank 1: compute", "overlap: ", "straggler: "})
    EXPECT_TRUE(contains(report.output, line)) << line << "\n" << report.output;

  const std::string dom = check_in_browser(fs::path(run) / "report.html", work, "report.png");
  for (const char* chart : {"chart-loss", "chart-throughput", "chart-time_split", "chart-memory"})
    EXPECT_TRUE(contains(dom, chart)) << chart;
}
