// A made-up run directory for the report's tests: metrics.jsonl and the traces of two ranks, in the formats of
// docs/observability.md, with figures small enough to check by hand.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace crosstrain::testing {

// A complete span.
inline nlohmann::json span(int pid, int tid, const std::string& name, const std::string& cat, double ts, double dur,
                           nlohmann::json args = nlohmann::json::object()) {
  return {{"ph", "X"}, {"pid", pid}, {"tid", tid}, {"name", name}, {"cat", cat}, {"ts", ts}, {"dur", dur},
          {"args", std::move(args)}};
}

inline nlohmann::json clock_event(int rank, double offset_us, int pp = 1) {
  return {{"ph", "M"}, {"pid", rank}, {"tid", 0}, {"name", "crosstrain_clock"},
          {"args", {{"offset_us", offset_us}, {"rtt_us", 40}, {"rank", rank}, {"world_size", 2}, {"dp", 2 / pp},
                    {"pp", pp}, {"tp", 1}, {"dp_index", pp == 1 ? rank : 0}, {"pp_index", pp == 1 ? 0 : rank},
                    {"tp_index", 0}, {"unix_us", 1700000000000000}}}};
}

inline nlohmann::json memory_event(int rank, double ts, double rss) {
  return {{"ph", "C"}, {"pid", rank}, {"tid", 0}, {"name", "memory"}, {"ts", ts},
          {"args", {{"rss_bytes", rss}, {"peak_rss_bytes", rss * 1.5}, {"model_state_bytes", 4 << 20}}}};
}

// The way a rank writes its file: "[", then one event per line, each with a comma, and no closing "]".
inline void write_trace(const std::filesystem::path& path, const std::vector<nlohmann::json>& events) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path);
  out << "[\n";
  for (const auto& e : events) out << e.dump() << ",\n";
}

// Rank `rank`'s `steps` steps of 100 ms: forward 30, backward 40 (a 10 ms wait inside), optimizer 10, a 5 ms wait;
// an all-reduce lane from 50 to 95 ms. Rank 1's clock runs 1 s behind rank 0's (offset +1e6 us).
inline std::vector<nlohmann::json> rank_events(int rank, int steps) {
  const double origin = rank == 0 ? 0 : -1e6;
  std::vector<nlohmann::json> events = {
      {{"ph", "M"}, {"pid", rank}, {"tid", 0}, {"name", "process_name"}, {"args", {{"name", "rank " + std::to_string(rank)}}}},
      {{"ph", "M"}, {"pid", rank}, {"tid", 0}, {"name", "thread_name"}, {"args", {{"name", "main"}}}},
      clock_event(rank, rank == 0 ? 0 : 1e6)};
  for (int s = 0; s < steps; ++s) {
    const double t = origin + s * 100000.0;
    events.push_back(span(rank, 0, "step", "step", t, 100000, {{"step", s + 1}}));
    events.push_back(span(rank, 0, "forward", "compute", t + 10000, 30000, {{"step", s + 1}, {"mb", 0}}));
    events.push_back(span(rank, 0, "backward", "compute", t + 40000, 40000, {{"step", s + 1}, {"mb", 0}}));
    events.push_back(span(rank, 0, "wait", "wait", t + 60000, 10000, {{"op", "all_reduce"}, {"group", "dp"}}));
    events.push_back(span(rank, 0, "optimizer", "optimizer", t + 80000, 10000, {{"step", s + 1}}));
    events.push_back(span(rank, 0, "wait", "wait", t + 90000, 5000, {{"op", "all_reduce"}, {"group", "dp"}}));
    events.push_back(span(rank, 1, "all_reduce", "comm", t + 50000, 45000, {{"group", "dp"}, {"bytes", 1 << 20}}));
  }
  events.push_back(memory_event(rank, origin + steps * 100000.0, (100 + 10 * rank) * double(1 << 20)));
  return events;
}

inline nlohmann::json metrics_row(int step) {
  nlohmann::json row = {{"step", step}, {"loss", 5.0 - 0.1 * step}, {"lr", 1e-3}, {"grad_norm", 1.0},
                        {"tokens_per_s", 1000.0 + step}, {"mfu", 0.01}, {"step_time_s", 0.1},
                        {"comm_time_s", 0.045}, {"exposed_comm_time_s", 0.015}, {"sync_mode", "diloco"},
                        {"wan_bytes", step * 1048576}, {"staleness_mean", 0.5}, {"staleness_max", 1}};
  if (step % 5 == 0) row["val_loss"] = 5.1 - 0.1 * step;
  return row;
}

// A run directory of `steps` steps on two ranks (with traces unless `traces` is false).
inline void write_synthetic_run(const std::filesystem::path& dir, int steps, bool traces = true) {
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream metrics(dir / "metrics.jsonl");
  for (int s = 1; s <= steps; ++s) metrics << metrics_row(s).dump() << "\n";
  if (!traces) return;
  for (int rank = 0; rank < 2; ++rank)
    write_trace(dir / "traces" / ("rank-" + std::to_string(rank) + ".json"), rank_events(rank, steps));
}

}  // namespace crosstrain::testing
