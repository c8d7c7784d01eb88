#include "crosstrain/obs/trace_analysis.h"

#include <algorithm>
#include <map>
#include <string>

#include "crosstrain/core/error.h"
#include "crosstrain/obs/median.h"

namespace crosstrain::obs {

Intervals merged(Intervals spans) {
  std::sort(spans.begin(), spans.end(), [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
  Intervals out;
  for (const Interval& span : spans) {
    if (span.end <= span.begin) continue;
    if (!out.empty() && span.begin <= out.back().end)
      out.back().end = std::max(out.back().end, span.end);
    else
      out.push_back(span);
  }
  return out;
}

Intervals intersection(const Intervals& a, const Intervals& b) {
  Intervals out;
  for (size_t i = 0, j = 0; i < a.size() && j < b.size();) {
    const double begin = std::max(a[i].begin, b[j].begin), end = std::min(a[i].end, b[j].end);
    if (begin < end) out.push_back({begin, end});
    // The one that ends first cannot meet anything further on in the other list.
    (a[i].end < b[j].end) ? ++i : ++j;
  }
  return out;
}

Intervals difference(const Intervals& a, const Intervals& b) {
  Intervals out;
  size_t j = 0;
  for (const Interval& span : a) {
    double begin = span.begin;
    while (j < b.size() && b[j].end <= begin) ++j;
    // Cut out each piece of b inside this span; j stays on a piece that may reach into the next span.
    for (size_t k = j; k < b.size() && b[k].begin < span.end; ++k) {
      if (b[k].begin > begin) out.push_back({begin, b[k].begin});
      begin = std::max(begin, b[k].end);
    }
    if (begin < span.end) out.push_back({begin, span.end});
  }
  return out;
}

double total_length(const Intervals& spans) {
  double sum = 0;
  for (const Interval& span : spans) sum += span.end - span.begin;
  return sum;
}

namespace {

// The spans of one rank, sorted into the kinds the figures need.
struct RankSpans {
  Intervals steps, compute, blocked, comm;
  double memory_ts = -1;
  int64_t step_count = 0;
};

double number(const nlohmann::json& object, const char* key, double fallback = 0) {
  auto it = object.find(key);
  return it != object.end() && it->is_number() ? it->get<double>() : fallback;
}

std::string text(const nlohmann::json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

void add_span(const nlohmann::json& event, RankSpans& spans) {
  const std::string cat = text(event, "cat"), name = text(event, "name");
  const double ts = number(event, "ts"), tid = number(event, "tid");
  const Interval span{ts, ts + number(event, "dur")};
  if (tid >= 1) {
    if (cat == "comm") spans.comm.push_back(span);
    return;
  }
  if (cat == "step") {
    spans.steps.push_back(span);
    ++spans.step_count;
  } else if (cat == "compute" || cat == "optimizer") {
    spans.compute.push_back(span);
  } else if (cat == "wait" || (cat == "p2p" && name.rfind("recv", 0) == 0)) {
    spans.blocked.push_back(span);
  }
}

void add_counter(const nlohmann::json& event, RankSpans& spans, RankTimes& times) {
  const std::string name = text(event, "name");
  const auto args = event.value("args", nlohmann::json::object());
  const double ts = number(event, "ts");
  if (name == "memory" && ts >= spans.memory_ts) {
    spans.memory_ts = ts;
    times.has_memory = true;
    times.rss_bytes = number(args, "rss_bytes");
    times.peak_rss_bytes = number(args, "peak_rss_bytes");
    times.model_state_bytes = number(args, "model_state_bytes");
  } else if (name == "dropped_events") {
    times.dropped_events += static_cast<int64_t>(number(args, "count"));  // each append counts its own
  }
}

// Reads the layout of the job from a rank's crosstrain_clock event; returns its pp.
int add_metadata(const nlohmann::json& event, RankTimes& times) {
  if (text(event, "name") != "crosstrain_clock") return 1;
  const auto args = event.value("args", nlohmann::json::object());
  times.dp_index = static_cast<int>(number(args, "dp_index", -1));
  times.pp_index = static_cast<int>(number(args, "pp_index", -1));
  times.tp_index = static_cast<int>(number(args, "tp_index", -1));
  return static_cast<int>(number(args, "pp", 1));
}

// Figures of one rank from its spans; all of them counted inside the steps.
void fill_times(const RankSpans& spans, int pp, RankTimes& times) {
  const Intervals steps = merged(spans.steps);
  const Intervals blocked = intersection(merged(spans.blocked), steps);
  // A wait inside a backward span (a gradient bucket's all-reduce) is communication, not compute.
  const Intervals compute = difference(intersection(merged(spans.compute), steps), blocked);
  times.steps = spans.step_count;
  times.step_us = total_length(steps);
  times.exposed_us = total_length(blocked);
  times.compute_us = total_length(compute);
  times.idle_us = std::max(0.0, times.step_us - times.compute_us - times.exposed_us);
  times.comm_us = total_length(intersection(merged(spans.comm), steps));
  if (times.comm_us > 0) times.overlap = std::clamp(1 - times.exposed_us / times.comm_us, 0.0, 1.0);
  if (pp > 1 && times.step_us > 0) times.bubble = 1 - times.compute_us / times.step_us;
  if (times.steps > 0) times.busy_per_step_us = (times.step_us - times.exposed_us) / static_cast<double>(times.steps);
}

// Ratios to the median busy time; the busiest rank is a straggler when beyond the margin.
void find_straggler(TraceAnalysis& analysis) {
  std::vector<double> busy;
  for (const auto& rank : analysis.ranks)
    if (rank.steps > 0) busy.push_back(rank.busy_per_step_us);
  analysis.median_busy_per_step_us = median(busy);
  if (analysis.median_busy_per_step_us <= 0) return;
  double highest = 0;
  for (auto& rank : analysis.ranks) {
    rank.straggler_ratio = rank.busy_per_step_us / analysis.median_busy_per_step_us;
    if (rank.straggler_ratio > highest) highest = rank.straggler_ratio, analysis.busiest_rank = rank.rank;
  }
  if (highest > 1 + analysis.straggler_margin) analysis.straggler_rank = analysis.busiest_rank;
}

void fill_job_figures(TraceAnalysis& analysis) {
  double exposed = 0, comm = 0, bubbles = 0;
  int pipelined = 0;
  for (const auto& rank : analysis.ranks) {
    exposed += rank.exposed_us;
    comm += rank.comm_us;
    if (rank.bubble >= 0) bubbles += rank.bubble, ++pipelined;
  }
  if (comm > 0) analysis.overlap = std::clamp(1 - exposed / comm, 0.0, 1.0);
  if (pipelined > 0) analysis.bubble = bubbles / pipelined;
  find_straggler(analysis);
}

}  // namespace

namespace {
TraceAnalysis analyze_trace_unchecked(const nlohmann::json& events, double straggler_margin);
}  // namespace

// A value of an unexpected type in an event's args (from a file written elsewhere) is the file's problem, named as
// such, not a JSON library's exception.
TraceAnalysis analyze_trace(const nlohmann::json& events, double straggler_margin) {
  try {
    return analyze_trace_unchecked(events, straggler_margin);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(std::string("trace: an event holds a value of an unexpected type (") + e.what() + ")");
  }
}

namespace {
TraceAnalysis analyze_trace_unchecked(const nlohmann::json& events, double straggler_margin) {
  std::map<int, RankSpans> spans;
  std::map<int, RankTimes> times;
  TraceAnalysis analysis;
  analysis.straggler_margin = straggler_margin;
  for (const auto& event : events) {
    if (!event.is_object()) continue;
    const int rank = static_cast<int>(number(event, "pid"));
    RankTimes& rank_times = times[rank];
    rank_times.rank = rank;
    const std::string ph = text(event, "ph");
    if (ph == "X") add_span(event, spans[rank]);
    if (ph == "C") add_counter(event, spans[rank], rank_times);
    if (ph == "M") analysis.pp = std::max(analysis.pp, add_metadata(event, rank_times));
  }
  for (auto& [rank, rank_times] : times) {
    fill_times(spans[rank], analysis.pp, rank_times);
    analysis.ranks.push_back(rank_times);
  }
  fill_job_figures(analysis);
  return analysis;
}
}  // namespace

}  // namespace crosstrain::obs
