#include "crosstrain/obs/trace_file.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "crosstrain/core/error.h"

namespace crosstrain::obs {
namespace fs = std::filesystem;

namespace {

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// `text` without trailing whitespace.
std::string trim_end(std::string text) {
  while (!text.empty() && is_space(text.back())) text.pop_back();
  return text;
}

// The array text closed the way a writer that never closes it (and ends every event with a comma) leaves it open.
std::string closed_array(std::string text) {
  text = trim_end(std::move(text));
  if (!text.empty() && text.back() == ']') return text;
  if (!text.empty() && text.back() == ',') text.pop_back();
  return text + "]";
}

// 1-based line of byte offset `byte` (nlohmann counts the bytes it read, so the offending one is byte - 1).
int64_t line_of(const std::string& text, size_t byte) {
  const size_t end = std::min(text.size(), byte > 0 ? byte - 1 : 0);
  return 1 + std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(end), '\n');
}

// Start of the last line that holds anything but whitespace.
size_t last_line_start(const std::string& text) {
  const std::string trimmed = trim_end(text);
  const size_t newline = trimmed.rfind('\n');
  return newline == std::string::npos ? 0 : newline + 1;
}

std::string excerpt_of_line(const std::string& text, int64_t line) {
  std::istringstream in(text);
  std::string content;
  for (int64_t i = 0; i < line && std::getline(in, content);) ++i;
  if (content.size() > 80) content = content.substr(0, 77) + "...";
  return content;
}

[[noreturn]] void throw_garbage(const std::string& text, const std::string& name, size_t byte, const char* why) {
  const int64_t line = line_of(text, byte);
  throw UsageError(name + ":" + std::to_string(line) + ": not a Chrome trace event array (" + why + "): '" +
                   excerpt_of_line(text, line) + "'");
}

// Every event an object whose standard fields have the trace format's types: the readers below take them as such.
void check_events_are_objects(const nlohmann::json& events, const std::string& name) {
  auto bad = [&](size_t i, const std::string& why) {
    throw UsageError(name + ": trace event " + std::to_string(i) + " " + why + ": " +
                     events[i].dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).substr(0, 80));
  };
  for (size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    if (!e.is_object()) bad(i, "is not a JSON object");
    for (const char* key : {"ph", "name", "cat"})
      if (e.contains(key) && !e[key].is_string()) bad(i, std::string("has a \"") + key + "\" that is not a string");
    for (const char* key : {"ts", "dur"})
      if (e.contains(key) && !e[key].is_number()) bad(i, std::string("has a \"") + key + "\" that is not a number");
    for (const char* key : {"pid", "tid"})
      if (e.contains(key) && !e[key].is_number() && !e[key].is_string())
        bad(i, std::string("has a \"") + key + "\" that is neither a number nor a string");
    if (e.contains("args") && !e["args"].is_object()) bad(i, "has \"args\" that are not an object");
  }
}

}  // namespace

nlohmann::json parse_trace_text(const std::string& text, const std::string& name) {
  const size_t first = text.find_first_not_of(" \n\r\t");
  if (first == std::string::npos) return nlohmann::json::array();  // created, nothing appended yet
  if (text[first] != '[') throw_garbage(text, name, first + 1, "it must start with '['");
  nlohmann::json events;
  try {
    events = nlohmann::json::parse(closed_array(text));
  } catch (const nlohmann::json::out_of_range& e) {
    throw_garbage(text, name, first + 1, e.what());  // a number too large for any type, say
  } catch (const nlohmann::json::parse_error& e) {
    // A rank killed in the middle of an append leaves a torn last line; every line before it is whole.
    const size_t torn = last_line_start(text);
    const bool torn_event = torn > first && text.compare(torn, 1, "{") == 0;
    if (!torn_event || line_of(text, e.byte) < line_of(text, torn + 1)) throw_garbage(text, name, e.byte, e.what());
    try {
      events = nlohmann::json::parse(closed_array(text.substr(0, torn)));
    } catch (const nlohmann::json::parse_error& again) {
      throw_garbage(text, name, again.byte, again.what());
    } catch (const nlohmann::json::exception& again) {
      throw_garbage(text, name, first + 1, again.what());
    }
  }
  if (!events.is_array()) throw_garbage(text, name, first + 1, "it is not an array");
  check_events_are_objects(events, name);
  return events;
}

nlohmann::json read_trace_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot read trace file '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  return parse_trace_text(text.str(), path);
}

std::vector<RankTraceFile> find_trace_files(const std::string& run_dir) {
  const fs::path dir = fs::path(run_dir) / "traces";
  std::vector<RankTraceFile> files;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string file = it->path().filename().string();
    const std::string digits = file.size() > 10 ? file.substr(5, file.size() - 10) : "";
    const bool named_by_rank = file.rfind("rank-", 0) == 0 && file.size() > 10 &&
                               file.compare(file.size() - 5, 5, ".json") == 0 && !digits.empty() &&
                               std::all_of(digits.begin(), digits.end(), ::isdigit);
    if (named_by_rank) files.push_back({std::stoi(digits), it->path().string()});
  }
  if (files.empty())
    throw UsageError("no trace files (traces/rank-R.json) in '" + run_dir +
                     "': was the run made with traces on? They are on by default; set obs.trace = true in the "
                     "recipe or pass --set obs.trace=true to crosstrain train");
  std::sort(files.begin(), files.end(), [](const auto& a, const auto& b) { return a.rank < b.rank; });
  return files;
}

ClockInfo clock_of(const nlohmann::json& events) {
  for (const auto& event : events) {
    if (event.value("ph", "") != "M" || event.value("name", "") != "crosstrain_clock") continue;
    const auto args = event.value("args", nlohmann::json::object());
    if (args.contains("offset_us") && args["offset_us"].is_number()) return {args["offset_us"].get<double>(), true};
  }
  return {};
}

namespace {

// ts + offset, kept an integer when both are (the writer writes whole microseconds).
void shift_ts(nlohmann::json& event, double offset_us) {
  auto ts = event.find("ts");
  if (ts == event.end() || !ts->is_number() || offset_us == 0) return;
  const bool whole = ts->is_number_integer() && offset_us == static_cast<double>(static_cast<int64_t>(offset_us));
  if (whole)
    *ts = ts->get<int64_t>() + static_cast<int64_t>(offset_us);
  else
    *ts = ts->get<double>() + offset_us;
}

double ts_of(const nlohmann::json& event) {
  auto ts = event.find("ts");
  return ts != event.end() && ts->is_number() ? ts->get<double>() : 0.0;
}

}  // namespace

nlohmann::json align_and_sort(const std::vector<nlohmann::json>& rank_events) {
  nlohmann::json metadata = nlohmann::json::array();
  std::vector<nlohmann::json> timed;
  for (const auto& events : rank_events) {
    // A resumed run appends to the file with a clock event of its own: each applies to the events after it.
    double offset_us = clock_of(events).offset_us;
    for (nlohmann::json event : events) {
      if (event.value("ph", "") == "M") {
        if (event.value("name", "") == "crosstrain_clock") offset_us = clock_of(nlohmann::json::array({event})).offset_us;
        metadata.push_back(std::move(event));
        continue;
      }
      shift_ts(event, offset_us);
      timed.push_back(std::move(event));
    }
  }
  // Stable: events of equal ts keep the order their rank wrote them in (a zero-length span before its successor).
  std::stable_sort(timed.begin(), timed.end(), [](const auto& a, const auto& b) { return ts_of(a) < ts_of(b); });
  for (auto& event : timed) metadata.push_back(std::move(event));
  return metadata;
}

namespace {

void fill_time_span(const nlohmann::json& events, MergeSummary& summary) {
  double begin = std::numeric_limits<double>::infinity(), end = -begin;
  for (const auto& event : events) {
    if (event.value("ph", "") == "M" || !event.contains("ts")) continue;
    begin = std::min(begin, ts_of(event));
    end = std::max(end, ts_of(event) + event.value("dur", 0.0));
  }
  if (begin <= end) summary.begin_us = begin, summary.end_us = end;
}

// Written under a temporary name, then renamed: a reader (Perfetto, a report) never sees half a file.
void write_atomically(const fs::path& path, const std::string& text) {
  const fs::path partial = path.string() + ".partial";
  {
    std::ofstream out(partial, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out.flush()) throw UsageError("cannot write '" + partial.string() + "'");
  }
  fs::rename(partial, path);
}

}  // namespace

MergeSummary merge_traces(const std::string& run_dir) {
  MergeSummary summary;
  std::vector<nlohmann::json> rank_events;
  for (const auto& file : find_trace_files(run_dir)) {
    rank_events.push_back(read_trace_file(file.path));
    if (!clock_of(rank_events.back()).has_clock) summary.ranks_without_clock.push_back(file.rank);
  }
  summary.ranks = static_cast<int>(rank_events.size());
  nlohmann::json events = align_and_sort(rank_events);
  summary.events = static_cast<int64_t>(events.size());
  fill_time_span(events, summary);
  const fs::path path = fs::path(run_dir) / "traces" / "merged.json";
  write_atomically(path, nlohmann::json{{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}}.dump());
  summary.path = path.string();
  return summary;
}

}  // namespace crosstrain::obs
