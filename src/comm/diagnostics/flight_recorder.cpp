#include "crosstrain/comm/diagnostics/flight_recorder.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

#include "crosstrain/core/error.h"

namespace crosstrain::comm {

const char* to_string(OpState s) {
  switch (s) {
    case OpState::Issued: return "issued";
    case OpState::Completed: return "completed";
    case OpState::Failed: return "failed";
  }
  return "?";
}

FlightRecorder::FlightRecorder(int global_rank, size_t capacity)
    : rank_(global_rank), capacity_(std::max<size_t>(1, capacity)), ring_(capacity_) {}

void FlightRecorder::set_sink(Sink sink) {
  std::lock_guard<std::mutex> lock(mu_);
  sink_ = std::move(sink);
}

int FlightRecorder::register_group(const std::string& name, std::vector<int> members) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < groups_.size(); ++i)
    if (groups_[i].name == name) return static_cast<int>(i);
  Group g;
  g.name = name;
  g.members = std::move(members);
  groups_.push_back(std::move(g));
  return static_cast<int>(groups_.size() - 1);
}

std::string FlightRecorder::group_name(int group) const {
  std::lock_guard<std::mutex> lock(mu_);
  return group >= 0 && group < static_cast<int>(groups_.size()) ? groups_[group].name : "?";
}

OpRecord FlightRecorder::issue(OpRecord r) {
  std::lock_guard<std::mutex> lock(mu_);
  Group& g = groups_.at(r.group);
  r.id = next_id_++;
  r.seq = r.p2p ? ++g.p2p : ++g.collectives;
  r.state = OpState::Issued;
  if (!r.p2p) {
    g.last_op = r.op;
    g.last_state = OpState::Issued;
  }
  ring_[r.id % capacity_] = r;
  in_flight_[r.id] = r;
  return r;
}

void FlightRecorder::finish(OpRecord r, OpState state) {
  r.state = state;
  Sink sink;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Group& g = groups_.at(r.group);
    if (!r.p2p && state == OpState::Completed) g.completed = std::max(g.completed, r.seq);
    if (!r.p2p && r.seq == g.collectives) g.last_state = state;
    OpRecord& slot = ring_[r.id % capacity_];
    if (slot.id == r.id) slot = r;
    in_flight_.erase(r.id);
    if (state == OpState::Failed && first_failure_.empty())
      first_failure_ = std::string(r.op) + " #" + std::to_string(r.seq) + " on '" + g.name + "'";
    sink = sink_;
  }
  if (sink) sink(r);
}

RankStatus FlightRecorder::status() const {
  RankStatus s;
  s.rank = rank_;
  s.activity = activity_.load(std::memory_order_relaxed);
  s.step = step_.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mu_);
  s.failure = first_failure_;
  for (const Group& g : groups_)
    s.groups.push_back({g.name, g.members, g.collectives, g.completed, g.last_op, to_string(g.last_state)});
  for (const auto& [id, r] : in_flight_) {
    if (s.pending.size() == 32) break;  // the oldest: what the rank is stuck on
    s.pending.push_back(r);
    s.pending_groups.push_back(groups_.at(r.group).name);
  }
  return s;
}

std::vector<OpRecord> FlightRecorder::recent() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<OpRecord> out;
  for (const OpRecord& r : ring_)
    if (r.id != 0) out.push_back(r);
  std::sort(out.begin(), out.end(), [](const OpRecord& a, const OpRecord& b) { return a.id < b.id; });
  return out;
}

// ---- the answers, as JSON through the store ----------------------------------------------------------------

std::string to_json(const RankStatus& s) {
  nlohmann::json j = {{"rank", s.rank}, {"activity", s.activity}, {"step", s.step}, {"failure", s.failure}};
  j["groups"] = nlohmann::json::array();
  for (const GroupProgress& g : s.groups)
    j["groups"].push_back({{"name", g.name}, {"members", g.members}, {"issued", g.issued},
                           {"completed", g.completed}, {"last_op", g.last_op}, {"last_state", g.last_state}});
  j["pending"] = nlohmann::json::array();
  for (size_t i = 0; i < s.pending.size(); ++i) {
    const OpRecord& r = s.pending[i];
    j["pending"].push_back({{"op", r.op}, {"group", s.pending_groups[i]}, {"seq", r.seq}, {"p2p", r.p2p},
                            {"peer", r.peer}, {"bytes", r.bytes}, {"step", r.step}});
  }
  return j.dump();
}

namespace {

// Op names come back as strings; a record holds static names, so they are interned here for the process.
const char* intern_op(const std::string& op) {
  static const char* known[] = {"broadcast", "reduce",     "all_reduce", "gather", "all_gather", "scatter",
                                "reduce_scatter", "all_to_all", "barrier", "send", "recv"};
  for (const char* k : known)
    if (op == k) return k;
  return "other";
}

}  // namespace

RankStatus rank_status_from_json(const std::string& text) {
  try {
    const nlohmann::json j = nlohmann::json::parse(text);
    RankStatus s;
    s.rank = j.at("rank").get<int>();
    s.activity = j.at("activity").get<std::string>();
    s.step = j.at("step").get<int64_t>();
    s.failure = j.value("failure", "");
    for (const auto& g : j.at("groups"))
      s.groups.push_back({g.at("name").get<std::string>(), g.at("members").get<std::vector<int>>(),
                          g.at("issued").get<int64_t>(), g.at("completed").get<int64_t>(),
                          g.at("last_op").get<std::string>(), g.at("last_state").get<std::string>()});
    for (const auto& p : j.at("pending")) {
      OpRecord r;
      r.op = intern_op(p.at("op").get<std::string>());
      r.seq = p.at("seq").get<int64_t>();
      r.p2p = p.at("p2p").get<bool>();
      r.peer = p.at("peer").get<int>();
      r.bytes = p.at("bytes").get<int64_t>();
      r.step = p.at("step").get<int64_t>();
      s.pending.push_back(r);
      s.pending_groups.push_back(p.at("group").get<std::string>());
    }
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("a rank's flight-recorder status is not valid: ") + e.what());
  }
}

// ---- the diagnosis ----------------------------------------------------------------------------------------

namespace {

// "all_reduce #67 on 'world.g3', recv #12 (peer 0) on 'pp'": what a rank waits for (at most three).
std::string pending_ops(const RankStatus& s, const std::string& only_group, bool other_groups) {
  std::string out;
  int listed = 0;
  for (size_t i = 0; i < s.pending.size() && listed < 3; ++i) {
    const bool same = s.pending_groups[i] == only_group;
    if (same == other_groups) continue;
    const OpRecord& r = s.pending[i];
    out += std::string(listed++ ? ", " : "") + r.op + " #" + std::to_string(r.seq) +
           (r.p2p && r.peer >= 0 ? " (peer " + std::to_string(r.peer) + ")" : "") +
           (other_groups ? " on '" + s.pending_groups[i] + "'" : "");
  }
  return out;
}

// What a rank is doing: its phase, and the operations of other groups it waits in (the next link of a chain).
std::string doing(const RankStatus& s, const std::string& group) {
  // A rank whose own operation failed first (it timed out as well, a moment earlier): that is the next link.
  if (!s.failure.empty())
    return "failed in " + s.failure + (s.step >= 0 ? " at step " + std::to_string(s.step) : "");
  const std::string elsewhere = pending_ops(s, group, true);
  std::string out = s.activity.empty() ? (elsewhere.empty() ? "between phases" : "waiting in " + elsewhere)
                                       : "in " + s.activity + (elsewhere.empty() ? "" : ", waiting in " + elsewhere);
  if (s.step >= 0) out += " at step " + std::to_string(s.step);
  return out;
}

const GroupProgress* find_group(const RankStatus& s, const std::string& name) {
  for (const GroupProgress& g : s.groups)
    if (g.name == name) return &g;
  return nullptr;
}

std::string list_ranks(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

std::string describe_member(const RankStatus& s, const OpRecord& stuck, const std::string& group) {
  const GroupProgress* g = find_group(s, group);
  if (!g) return "rank " + std::to_string(s.rank) + " has no group '" + group + "' (" + doing(s, group) + ")";
  if (g->issued < stuck.seq) {
    std::string last = g->issued == 0 ? "no collective there yet"
                                      : "its last there: #" + std::to_string(g->issued) + " " + g->last_op + ", " +
                                            g->last_state;
    return "rank " + std::to_string(s.rank) + " never reached it (" + last + "; now " + doing(s, group) + ")";
  }
  if (g->completed >= stuck.seq)
    return "rank " + std::to_string(s.rank) + " completed it (now " + doing(s, group) + ")";
  return "";  // waiting in it too: listed together
}

std::string describe_p2p_peer(const RankStatus& s, const std::string& group) {
  const std::string here = pending_ops(s, group, false);
  return "peer rank " + std::to_string(s.rank) + (s.failure.empty() ? " is " : " ") + doing(s, group) +
         (here.empty() ? ", with nothing pending in that group" : ", with pending " + here);
}

}  // namespace

std::string diagnose_hang(const OpRecord& stuck, const std::string& group, const std::vector<int>& members,
                          int asking_rank, const std::vector<RankStatus>& answers, double waited_s) {
  std::map<int, const RankStatus*> by_rank;
  for (const RankStatus& s : answers) by_rank[s.rank] = &s;
  std::vector<std::string> findings;
  std::vector<int> waiting, silent;
  std::vector<int> asked = members;
  if (stuck.p2p && stuck.peer >= 0 && stuck.peer < static_cast<int>(members.size())) asked = {members[stuck.peer]};
  for (int m : asked) {
    if (m == asking_rank) continue;
    auto it = by_rank.find(m);
    if (it == by_rank.end()) {
      silent.push_back(m);
      continue;
    }
    const std::string finding = stuck.p2p ? describe_p2p_peer(*it->second, group) : describe_member(*it->second, stuck, group);
    if (finding.empty()) waiting.push_back(m);
    else findings.push_back(finding);
  }
  if (!waiting.empty()) findings.push_back(list_ranks(waiting) + " wait in it too");
  char seconds[32];
  std::snprintf(seconds, sizeof seconds, "%.1f", waited_s);
  if (!silent.empty())
    findings.push_back(list_ranks(silent) + " did not answer within " + seconds +
                       " s (dead, stopped, or cut off from the store)");
  std::string out = "hang diagnosis for " + std::string(stuck.op) + " #" + std::to_string(stuck.seq) + " on group '" +
                    group + "'";
  if (stuck.step >= 0) out += " at step " + std::to_string(stuck.step);
  out += ": ";
  for (size_t i = 0; i < findings.size(); ++i) out += (i ? "; " : "") + findings[i];
  if (findings.empty()) out += "every member answered and is past it (a transport fault?)";
  return out;
}

}  // namespace crosstrain::comm
