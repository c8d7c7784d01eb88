// The run report (`crosstrain report RUN_DIR`): one self-contained HTML page from metrics.jsonl and the ranks'
// traces (Chart.js inlined from Debian's libjs-chart.js: the page opens without a network), and a short text
// summary for the terminal.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "crosstrain/obs/trace_analysis.h"

namespace crosstrain::obs {

// Where Debian's libjs-chart.js (3.9) puts the minified library.
inline constexpr const char* kChartJsPath = "/usr/share/javascript/chart.js/chart.min.js";

// What a report is made of.
struct RunData {
  std::string run_dir;
  std::vector<nlohmann::json> metrics;  // metrics.jsonl rows, in file order
  std::string metrics_note;             // when there are none: why ("no metrics.jsonl in ...")
  std::optional<TraceAnalysis> trace;
  int trace_files = 0;
  std::string trace_note;               // when there is no analysis: why (no traces; suggests obs.trace)
};

// metrics.jsonl rows from text. A torn last line (a crash) is dropped; garbage elsewhere is a UsageError naming
// `name` and the line.
std::vector<nlohmann::json> parse_metrics_text(const std::string& text, const std::string& name);

// Reads run_dir/metrics.jsonl and run_dir/traces/rank-R.json. Either may be missing (the note says so), not both.
RunData load_run(const std::string& run_dir);

// The headline figures, shared by the page and the terminal summary.
struct RunFigures {
  int64_t rows = 0, last_step = 0;
  std::optional<double> final_loss, final_val_loss;
  int64_t final_val_step = 0;
  std::optional<double> tokens_per_s, mfu;  // medians over the rows (robust to the first step's warm-up)
  std::string sync_mode;
  std::optional<double> wan_bytes;          // the last row's (cumulative)
  std::optional<double> staleness_mean;     // mean over the rows that have it
};
RunFigures run_figures(const std::vector<nlohmann::json>& metrics);

// The contents of chart.min.js; a UsageError telling how to install it when missing.
std::string chart_js_source(const std::string& path = kChartJsPath);

// The whole page. Its script sets document.body.dataset.status to "ok" once every chart is built with data,
// else to "error: ...".
std::string report_html(const RunData& run, const std::string& chart_js);

// A few lines for the terminal: steps, losses, throughput, per-rank split of step time, overlap, bubble, straggler.
std::string report_summary_text(const RunData& run);

// Writes report_html (with chart_js_source()) to `path`, atomically.
void write_report(const RunData& run, const std::string& path);

}  // namespace crosstrain::obs
