#include "crosstrain/obs/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "crosstrain/core/error.h"
#include "crosstrain/obs/median.h"
#include "crosstrain/obs/trace_file.h"

namespace crosstrain::obs {
namespace fs = std::filesystem;

// ---- reading a run ---------------------------------------------------------------------------------------------

std::vector<nlohmann::json> parse_metrics_text(const std::string& text, const std::string& name) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  while (!lines.empty() && lines.back().find_first_not_of(" \r\t") == std::string::npos) lines.pop_back();
  std::vector<nlohmann::json> rows;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].find_first_not_of(" \r\t") == std::string::npos) continue;
    try {
      rows.push_back(nlohmann::json::parse(lines[i]));
      if (!rows.back().is_object()) throw UsageError("not a JSON object");
    } catch (const std::exception& e) {
      // The writer flushes whole lines, so only a crash in the middle of the last one leaves it torn.
      if (i + 1 == lines.size() && lines[i].rfind('{', 0) == 0 && lines[i].back() != '}') break;
      throw UsageError(name + ":" + std::to_string(i + 1) + ": not a metrics row (one JSON object per line): '" +
                       lines[i].substr(0, 80) + "'");
    }
  }
  return rows;
}

namespace {

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot read '" + path.string() + "'");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void load_metrics(RunData& run) {
  const fs::path path = fs::path(run.run_dir) / "metrics.jsonl";
  if (!fs::exists(path)) {
    run.metrics_note = "no metrics.jsonl in '" + run.run_dir + "'";
    return;
  }
  run.metrics = parse_metrics_text(read_text(path), path.string());
  if (run.metrics.empty()) run.metrics_note = path.string() + " has no rows yet";
}

void load_traces(RunData& run) {
  std::vector<RankTraceFile> files;
  try {
    files = find_trace_files(run.run_dir);
  } catch (const UsageError& e) {
    run.trace_note = std::string("no traces: ") + e.what();
    return;
  }
  nlohmann::json events = nlohmann::json::array();
  for (const auto& file : files)
    for (auto& event : read_trace_file(file.path)) events.push_back(std::move(event));
  run.trace_files = static_cast<int>(files.size());
  run.trace = analyze_trace(events);
}

}  // namespace

RunData load_run(const std::string& run_dir) {
  if (!fs::is_directory(run_dir)) throw UsageError("'" + run_dir + "' is not a directory (give a run.dir)");
  RunData run;
  run.run_dir = run_dir;
  load_metrics(run);
  load_traces(run);
  if (run.metrics.empty() && !run.trace)
    throw UsageError("nothing to report in '" + run_dir + "': " + run.metrics_note + "; " + run.trace_note);
  return run;
}

// ---- figures ---------------------------------------------------------------------------------------------------

namespace {

std::optional<double> number_at(const nlohmann::json& row, const char* key) {
  auto it = row.find(key);
  if (it == row.end() || !it->is_number()) return std::nullopt;
  const double value = it->get<double>();
  return std::isfinite(value) ? std::optional<double>(value) : std::nullopt;
}

std::optional<double> median_of(const std::vector<double>& values) {
  return values.empty() ? std::nullopt : std::optional<double>(median(values));
}

std::vector<double> column(const std::vector<nlohmann::json>& rows, const char* key) {
  std::vector<double> values;
  for (const auto& row : rows)
    if (auto value = number_at(row, key)) values.push_back(*value);
  return values;
}

}  // namespace

RunFigures run_figures(const std::vector<nlohmann::json>& metrics) {
  RunFigures f;
  f.rows = static_cast<int64_t>(metrics.size());
  for (const auto& row : metrics) {
    f.last_step = std::max<int64_t>(f.last_step, static_cast<int64_t>(number_at(row, "step").value_or(0)));
    if (auto loss = number_at(row, "loss")) f.final_loss = loss;
    if (auto val = number_at(row, "val_loss")) f.final_val_loss = val, f.final_val_step = row.value("step", 0);
    if (auto wan = number_at(row, "wan_bytes")) f.wan_bytes = wan;
    if (row.contains("sync_mode") && row["sync_mode"].is_string()) f.sync_mode = row["sync_mode"];
  }
  f.tokens_per_s = median_of(column(metrics, "tokens_per_s"));
  f.mfu = median_of(column(metrics, "mfu"));
  const std::vector<double> staleness = column(metrics, "staleness_mean");
  if (!staleness.empty()) {
    double sum = 0;
    for (double s : staleness) sum += s;
    f.staleness_mean = sum / static_cast<double>(staleness.size());
  }
  return f;
}

std::string chart_js_source(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw UsageError("the report needs Chart.js from Debian's libjs-chart.js, and '" + path +
                     "' is missing: apt-get install libjs-chart.js");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// ---- text ------------------------------------------------------------------------------------------------------

namespace {

std::string fmt(const char* format, double value) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, value);
  return buf;
}

std::string percent(double fraction) { return fmt("%.1f%%", 100 * fraction); }

std::string percent_of(double part, double whole) { return whole > 0 ? percent(part / whole) : "n/a"; }

double ms_per_step(double total_us, int64_t steps) { return steps > 0 ? total_us / 1000.0 / steps : 0; }

std::string overlap_text(double overlap) {
  return overlap < 0 ? "n/a (no communication traced)" : percent(overlap) + " of communication hidden behind compute";
}

std::string bubble_text(const TraceAnalysis& trace) {
  return trace.bubble < 0 ? "n/a (pp = " + std::to_string(trace.pp) + ")" : percent(trace.bubble);
}

std::string straggler_text(const TraceAnalysis& trace) {
  if (trace.busiest_rank < 0) return "n/a (no step spans)";
  const auto& busiest = *std::find_if(trace.ranks.begin(), trace.ranks.end(),
                                      [&](const RankTimes& r) { return r.rank == trace.busiest_rank; });
  const std::string ratio = fmt("%.2fx", busiest.straggler_ratio);
  if (trace.straggler_rank >= 0)
    return "rank " + std::to_string(trace.straggler_rank) + " (" + ratio + " the median busy time per step)";
  return "none (busiest: rank " + std::to_string(trace.busiest_rank) + " at " + ratio + " the median)";
}

std::string metrics_summary(const RunData& run) {
  if (run.metrics.empty()) return "metrics: " + run.metrics_note + "\n";
  const RunFigures f = run_figures(run.metrics);
  std::string text = "steps: " + std::to_string(f.last_step) + " (" + std::to_string(f.rows) + " metrics rows)";
  if (f.final_loss) text += " | final loss " + fmt("%.4f", *f.final_loss);
  if (f.final_val_loss)
    text += " | val loss " + fmt("%.4f", *f.final_val_loss) + " (step " + std::to_string(f.final_val_step) + ")";
  text += "\nthroughput: " + (f.tokens_per_s ? fmt("%.0f", *f.tokens_per_s) : std::string("n/a")) +
          " tokens/s | MFU " + (f.mfu ? fmt("%.2f%%", 100 * *f.mfu) : std::string("n/a")) + " (medians over steps)";
  if (!f.sync_mode.empty()) text += " | sync " + f.sync_mode;
  // Only where something crossed (or could cross) the wide area: a pipeline or one cluster's plain sync sends none.
  if (f.wan_bytes && (*f.wan_bytes > 0 || f.sync_mode != "sync"))
    text += " | wide-area " + fmt("%.1f MiB", *f.wan_bytes / (1 << 20));
  if (f.staleness_mean) text += " | staleness " + fmt("%.2f", *f.staleness_mean);
  return text + "\n";
}

std::string trace_summary(const RunData& run) {
  if (!run.trace) return "traces: " + run.trace_note + "\n";
  const TraceAnalysis& trace = *run.trace;
  std::string text;
  for (const RankTimes& r : trace.ranks)
    text += "rank " + std::to_string(r.rank) + ": compute " + percent_of(r.compute_us, r.step_us) + " | exposed comm " +
            percent_of(r.exposed_us, r.step_us) + " | idle " + percent_of(r.idle_us, r.step_us) + " of " +
            fmt("%.1f", ms_per_step(r.step_us, r.steps)) + " ms/step (" + std::to_string(r.steps) + " steps traced)\n";
  text += "overlap: " + overlap_text(trace.overlap) + " | pipeline bubble: " + bubble_text(trace) + "\n";
  return text + "straggler: " + straggler_text(trace) + "\n";
}

}  // namespace

std::string report_summary_text(const RunData& run) { return metrics_summary(run) + trace_summary(run); }

// ---- the page --------------------------------------------------------------------------------------------------

namespace {

std::string html_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

using Row = std::vector<std::string>;

std::string html_table(const std::string& id, const Row& headers, const std::vector<Row>& rows) {
  std::string html = "<table id=\"" + id + "\">";
  if (!headers.empty()) {
    html += "<thead><tr>";
    for (const auto& h : headers) html += "<th>" + html_escape(h) + "</th>";
    html += "</tr></thead>";
  }
  html += "<tbody>";
  for (const auto& row : rows) {
    html += "<tr>";
    for (const auto& cell : row) html += "<td>" + html_escape(cell) + "</td>";
    html += "</tr>";
  }
  return html + "</tbody></table>\n";
}

std::string optional_number(const std::optional<double>& value, const char* format, double scale = 1) {
  return value ? fmt(format, *value * scale) : "n/a";
}

std::string summary_table(const RunData& run) {
  const RunFigures f = run_figures(run.metrics);
  std::vector<Row> rows = {{"run directory", run.run_dir},
                           {"steps", std::to_string(f.last_step) + " (" + std::to_string(f.rows) + " metrics rows)"},
                           {"final loss", optional_number(f.final_loss, "%.4f")},
                           {"final validation loss", optional_number(f.final_val_loss, "%.4f")},
                           {"tokens/s (median over steps)", optional_number(f.tokens_per_s, "%.0f")},
                           {"MFU (median over steps)", optional_number(f.mfu, "%.2f%%", 100)}};
  if (!f.sync_mode.empty()) rows.push_back({"sync mode", f.sync_mode});
  if (f.wan_bytes) rows.push_back({"wide-area bytes (cumulative, last row)", fmt("%.1f MiB", *f.wan_bytes / (1 << 20))});
  if (f.staleness_mean) rows.push_back({"staleness (mean)", fmt("%.2f steps", *f.staleness_mean)});
  if (run.trace) {
    rows.push_back({"ranks traced", std::to_string(run.trace->ranks.size())});
    rows.push_back({"communication overlap", overlap_text(run.trace->overlap)});
    rows.push_back({"pipeline bubble", bubble_text(*run.trace)});
    rows.push_back({"straggler", straggler_text(*run.trace)});
  }
  return html_table("summary", {}, rows);
}

std::string index_text(int index) { return index < 0 ? "-" : std::to_string(index); }

std::string mib_text(const RankTimes& r, double bytes) { return r.has_memory ? fmt("%.1f", bytes / (1 << 20)) : "n/a"; }

std::string rank_table(const TraceAnalysis& trace) {
  std::vector<Row> rows;
  for (const RankTimes& r : trace.ranks)
    rows.push_back({std::to_string(r.rank), index_text(r.dp_index) + "/" + index_text(r.pp_index) + "/" +
                    index_text(r.tp_index), std::to_string(r.steps), fmt("%.2f", ms_per_step(r.step_us, r.steps)),
                    percent_of(r.compute_us, r.step_us), percent_of(r.exposed_us, r.step_us),
                    percent_of(r.idle_us, r.step_us), fmt("%.2f", ms_per_step(r.comm_us, r.steps)),
                    r.overlap < 0 ? "n/a" : percent(r.overlap), r.bubble < 0 ? "n/a" : percent(r.bubble),
                    mib_text(r, r.rss_bytes), mib_text(r, r.peak_rss_bytes), mib_text(r, r.model_state_bytes),
                    std::to_string(r.dropped_events)});
  return html_table("ranks", {"rank", "dp/pp/tp", "steps", "ms/step", "compute", "exposed comm", "idle",
                              "comm ms/step", "overlap", "bubble", "RSS MiB", "peak RSS MiB", "model state MiB",
                              "dropped events"}, rows);
}

std::string straggler_table(const TraceAnalysis& trace) {
  std::vector<Row> rows;
  for (const RankTimes& r : trace.ranks)
    rows.push_back({std::to_string(r.rank), fmt("%.2f", r.busy_per_step_us / 1000), fmt("%.2f", r.straggler_ratio),
                    r.rank == trace.straggler_rank ? "straggler"
                    : r.rank == trace.busiest_rank && r.straggler_ratio > 1 ? "busiest" : ""});
  return html_table("stragglers", {"rank", "busy ms/step", "ratio to median", ""}, rows);
}

// The online detector's last verdict, from the metrics rows that carry it.
std::string online_straggler_text(const std::vector<nlohmann::json>& metrics) {
  for (auto row = metrics.rbegin(); row != metrics.rend(); ++row) {
    if (!row->contains("straggler_score")) continue;
    const int rank = row->value("straggler_rank", -1);
    std::string scores;
    for (const auto& score : (*row)["straggler_score"])
      scores += (scores.empty() ? "" : ", ") + (score.is_number() ? fmt("%.2f", score.get<double>()) : score.dump());
    return "<p>Online detector (metrics.jsonl, step " + std::to_string(row->value("step", 0)) + "): busy over median " +
           html_escape(scores) + " (by rank); straggler: " +
           (rank < 0 ? std::string("none") : "rank " + std::to_string(rank)) + ".</p>\n";
  }
  return "";
}

// [[step, value], ...] of the rows with a finite `key`, times `scale`.
nlohmann::json points(const std::vector<nlohmann::json>& metrics, const char* key, double scale = 1) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& row : metrics) {
    auto step = number_at(row, "step");
    auto value = number_at(row, key);
    if (step && value) out.push_back({*step, *value * scale});
  }
  return out;
}

nlohmann::json rank_series(const TraceAnalysis& trace) {
  nlohmann::json s = {{"labels", nlohmann::json::array()}};
  for (const RankTimes& r : trace.ranks) {
    s["labels"].push_back("rank " + std::to_string(r.rank));
    s["compute_ms"].push_back(ms_per_step(r.compute_us, r.steps));
    s["exposed_ms"].push_back(ms_per_step(r.exposed_us, r.steps));
    s["idle_ms"].push_back(ms_per_step(r.idle_us, r.steps));
    s["rss_mib"].push_back(r.rss_bytes / (1 << 20));
    s["peak_mib"].push_back(r.peak_rss_bytes / (1 << 20));
    s["model_state_mib"].push_back(r.model_state_bytes / (1 << 20));
  }
  return s;
}

bool any_nonzero(const nlohmann::json& pts) {
  return std::any_of(pts.begin(), pts.end(), [](const nlohmann::json& p) { return p[1].get<double>() != 0; });
}

// Everything the charts plot, and which charts to build: only those with data (the page fails on an empty one).
nlohmann::json chart_data(const RunData& run) {
  nlohmann::json d = {{"charts", nlohmann::json::array()}};
  const auto& m = run.metrics;
  d["loss"] = points(m, "loss"), d["val_loss"] = points(m, "val_loss");
  d["tokens_per_s"] = points(m, "tokens_per_s"), d["mfu_pct"] = points(m, "mfu", 100);
  d["wan_mib"] = points(m, "wan_bytes", 1.0 / (1 << 20));
  d["staleness_mean"] = points(m, "staleness_mean"), d["staleness_max"] = points(m, "staleness_max");
  if (!d["loss"].empty()) d["charts"].push_back("loss");
  if (!d["tokens_per_s"].empty() && !d["mfu_pct"].empty()) d["charts"].push_back("throughput");
  if (run.trace && run.trace->busiest_rank >= 0) d["charts"].push_back("time_split");
  const bool memory = run.trace && std::any_of(run.trace->ranks.begin(), run.trace->ranks.end(),
                                               [](const RankTimes& r) { return r.has_memory; });
  if (memory) d["charts"].push_back("memory");
  if (any_nonzero(d["wan_mib"])) d["charts"].push_back("wan");
  if (!d["staleness_mean"].empty()) d["charts"].push_back("staleness");
  if (run.trace) d["ranks"] = rank_series(*run.trace);
  return d;
}

std::string chart_title(const std::string& id) {
  if (id == "loss") return "Loss and validation loss";
  if (id == "throughput") return "Tokens/s and MFU";
  if (id == "time_split") return "Step time per rank: compute / exposed communication / idle (ms per step)";
  if (id == "memory") return "Memory per rank (MiB, last memory counter)";
  if (id == "wan") return "Wide-area bytes (MiB, cumulative)";
  return "Staleness (steps)";
}

std::string chart_boxes(const nlohmann::json& charts) {
  std::string html = "<div class=\"charts\">\n";
  for (const auto& entry : charts) {
    const std::string id = entry.get<std::string>();
    html += "<figure><figcaption>" + html_escape(chart_title(id)) + "</figcaption><div class=\"chart\"><canvas id=\"chart-" +
            id + "\"></canvas></div></figure>\n";
  }
  return html + "</div>\n";
}

std::string trace_section(const RunData& run) {
  std::string html = "<h2>Ranks</h2>\n";
  if (!run.trace) return html + "<p class=\"note\" id=\"no-traces\">" + html_escape(run.trace_note) + "</p>\n";
  html += "<p>From " + std::to_string(run.trace_files) +
          " trace files (run.dir/traces). Compute, exposed communication and idle add up to the step time; overlap is "
          "1 - exposed / communication time.</p>\n" + rank_table(*run.trace);
  html += "<h2>Stragglers</h2>\n<p>Busy time: step time less the time blocked on others, per step; a rank busier "
          "than the median by more than " + percent(run.trace->straggler_margin) + " is a straggler.</p>\n";
  return html + straggler_table(*run.trace) + online_straggler_text(run.metrics);
}

// JSON inside a <script> element: no "</script>" can end it early.
std::string script_safe(const std::string& text) {
  std::string out;
  for (char c : text) out += c == '<' ? std::string("\\u003c") : std::string(1, c);
  return out;
}

std::string without_script_end(std::string js) {
  for (size_t at = js.find("</script"); at != std::string::npos; at = js.find("</script", at)) js.replace(at, 2, "<\\/");
  return js;
}

constexpr const char* kStyle = R"CSS(
body { font-family: sans-serif; margin: 24px; color: #222; max-width: 1360px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
td, th { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
td:first-child, th:first-child { text-align: left; }
.charts { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; }
figure { margin: 0; border: 1px solid #ddd; padding: 8px; }
figcaption { font-size: 13px; font-weight: bold; margin-bottom: 4px; }
.chart { position: relative; height: 300px; }
.note { color: #a33; }
)CSS";

// Builds each chart named in data.charts; "ok" only when all were built with data in every series.
constexpr const char* kScript = R"JS(
(function () {
  'use strict';
  function setStatus(text) { document.body.dataset.status = text; }
  window.onerror = function (message) { setStatus('error: ' + message); };
  var data = JSON.parse(document.getElementById('report-data').textContent);
  Chart.defaults.animation = false;
  Chart.defaults.maintainAspectRatio = false;
  function xy(points) { return points.map(function (p) { return {x: p[0], y: p[1]}; }); }
  function series(label, points, color, more) {
    var s = {label: label, data: xy(points), borderColor: color, backgroundColor: color, pointRadius: 0, borderWidth: 2};
    return Object.assign(s, more || {});
  }
  function axis(title, more) { return Object.assign({title: {display: true, text: title}}, more || {}); }
  function lineChart(canvas, datasets, yTitle, moreScales) {
    var scales = Object.assign({x: axis('step', {type: 'linear'}), y: axis(yTitle, {beginAtZero: true})},
                               moreScales || {});
    return new Chart(canvas, {type: 'line', data: {datasets: datasets}, options: {scales: scales}});
  }
  function barChart(canvas, datasets, yTitle, stacked) {
    return new Chart(canvas, {type: 'bar', data: {labels: data.ranks.labels, datasets: datasets},
      options: {scales: {x: {stacked: stacked}, y: axis(yTitle, {stacked: stacked, beginAtZero: true})}}});
  }
  var builders = {
    loss: function (canvas) {
      var sets = [series('loss', data.loss, '#1f77b4')];
      if (data.val_loss.length) sets.push(series('validation loss', data.val_loss, '#d62728', {pointRadius: 3}));
      return lineChart(canvas, sets, 'loss', {y: axis('loss')});  // near its minimum, not from zero
    },
    throughput: function (canvas) {  // MFU follows tokens/s: dashed, it shows where the lines coincide
      return lineChart(canvas, [series('tokens/s', data.tokens_per_s, '#2ca02c'),
                                series('MFU %', data.mfu_pct, '#9467bd', {yAxisID: 'y1', borderDash: [6, 4]})], 'tokens/s',
                       {y1: axis('MFU %', {position: 'right', beginAtZero: true, grid: {drawOnChartArea: false}})});
    },
    time_split: function (canvas) {
      var r = data.ranks;
      return barChart(canvas, [series('compute', [], '#1f77b4', {data: r.compute_ms}),
                               series('exposed communication', [], '#d62728', {data: r.exposed_ms}),
                               series('idle', [], '#bbbbbb', {data: r.idle_ms})], 'ms per step', true);
    },
    memory: function (canvas) {
      var r = data.ranks;
      return barChart(canvas, [series('RSS', [], '#1f77b4', {data: r.rss_mib}),
                               series('peak RSS', [], '#ff7f0e', {data: r.peak_mib}),
                               series('model state', [], '#2ca02c', {data: r.model_state_mib})], 'MiB', false);
    },
    wan: function (canvas) { return lineChart(canvas, [series('wide-area MiB', data.wan_mib, '#8c564b')], 'MiB'); },
    staleness: function (canvas) {
      var sets = [series('mean', data.staleness_mean, '#17becf')];
      if (data.staleness_max.length) sets.push(series('max', data.staleness_max, '#e377c2'));
      return lineChart(canvas, sets, 'steps');
    }
  };
  if (!data.charts.length) throw new Error('no chart has data');
  data.charts.forEach(function (id) {
    var canvas = document.getElementById('chart-' + id);
    if (!canvas || !builders[id]) throw new Error('chart ' + id + ' has no canvas or builder');
    var chart = builders[id](canvas);
    chart.data.datasets.forEach(function (set) {
      if (!set.data.length) throw new Error('chart ' + id + ': series "' + set.label + '" is empty');
    });
  });
  setStatus('ok');
})();
)JS";

std::string page_head(const RunData& run) {
  // No network: the policy forbids every fetch, so a stray reference fails loudly in the browser's console.
  return "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
         "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; script-src 'unsafe-inline'; "
         "style-src 'unsafe-inline'; img-src data:\">\n<title>crosstrain report: " + html_escape(run.run_dir) +
         "</title>\n<style>" + kStyle + "</style></head>\n";
}

}  // namespace

std::string report_html(const RunData& run, const std::string& chart_js) {
  const nlohmann::json data = chart_data(run);
  std::string html = page_head(run) + "<body data-status=\"loading\">\n<h1>crosstrain run report</h1>\n";
  html += "<h2>Summary</h2>\n" + summary_table(run);
  if (run.metrics.empty()) html += "<p class=\"note\" id=\"no-metrics\">" + html_escape(run.metrics_note) + "</p>\n";
  html += "<h2>Charts</h2>\n" + chart_boxes(data["charts"]) + trace_section(run);
  html += "<pre id=\"summary-text\">" + html_escape(report_summary_text(run)) + "</pre>\n";
  html += "<script type=\"application/json\" id=\"report-data\">" + script_safe(data.dump()) + "</script>\n";
  html += "<script>" + without_script_end(chart_js) + "</script>\n<script>" + kScript + "</script>\n";
  return html + "</body></html>\n";
}

void write_report(const RunData& run, const std::string& path) {
  const std::string html = report_html(run, chart_js_source());
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    out << html;
    if (!out.flush()) throw UsageError("cannot write the report to '" + partial + "'");
  }
  fs::rename(partial, path);
}

}  // namespace crosstrain::obs
