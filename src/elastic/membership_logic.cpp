#include "crosstrain/elastic/membership_logic.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <stdexcept>

namespace crosstrain::elastic {

using json = nlohmann::json;

void FailureDetector::observe(int rank, const std::string& incarnation, int64_t value, Clock::time_point now) {
  Seen& s = seen_[rank];
  if (s.incarnation != incarnation) s = Seen{incarnation, value, now, false};  // a new process: a fresh start
  if (value != s.value) {
    s.value = value;
    s.moved = now;
  }
}

void FailureDetector::exited(int rank, int pid) {
  auto it = seen_.find(rank);
  if (it != seen_.end() && pid_of_incarnation(it->second.incarnation) == pid) it->second.exited = true;
}

bool FailureDetector::dead(int rank, const std::string& incarnation, Clock::time_point now) const {
  auto it = seen_.find(rank);
  if (it == seen_.end() || it->second.incarnation != incarnation) return false;  // not watched yet
  return it->second.exited || now - it->second.moved > timeout_;
}

bool FailureDetector::has_exited(int rank, const std::string& incarnation) const {
  auto it = seen_.find(rank);
  return it != seen_.end() && it->second.incarnation == incarnation && it->second.exited;
}

std::chrono::milliseconds FailureDetector::silent_for(int rank, Clock::time_point now) const {
  auto it = seen_.find(rank);
  if (it == seen_.end()) return std::chrono::milliseconds(0);
  return std::chrono::duration_cast<std::chrono::milliseconds>(now - it->second.moved);
}

namespace {

json parse(const std::string& text, const char* what) {
  try {
    return json::parse(text);
  } catch (const std::exception& e) {
    throw std::runtime_error(std::string("malformed elastic ") + what + " record '" + text.substr(0, 80) + "'");
  }
}

template <typename T>
T field(const json& j, const char* key, const char* what) {
  if (!j.contains(key)) throw std::runtime_error(std::string("elastic ") + what + " record lacks '" + key + "'");
  return j.at(key).get<T>();
}

}  // namespace

std::string incarnation_of(const std::string& host, int pid, int64_t start_ms) {
  return host + "/" + std::to_string(pid) + "/" + std::to_string(start_ms);
}

int pid_of_incarnation(const std::string& incarnation) {
  const auto first = incarnation.find('/');
  const auto second = first == std::string::npos ? std::string::npos : incarnation.find('/', first + 1);
  if (second == std::string::npos) return -1;
  try {
    return std::stoi(incarnation.substr(first + 1, second - first - 1));
  } catch (const std::exception&) {
    return -1;
  }
}

std::string encode_registration(const Registration& r) {
  return json{{"rank", r.rank},
              {"replica", r.replica},
              {"replica_size", r.replica_size},
              {"incarnation", r.incarnation},
              {"heartbeat_ms", r.timing.heartbeat_ms},
              {"failure_timeout_ms", r.timing.failure_timeout_ms},
              {"min_replicas", r.timing.min_replicas},
              {"last_generation", r.last_generation},
              {"trained_in", r.trained_in},
              {"last_members", r.last_members}}
      .dump();
}

Registration decode_registration(const std::string& text) {
  const json j = parse(text, "registration");
  Registration r;
  try {
    r.rank = field<int>(j, "rank", "registration");
    r.replica = field<int>(j, "replica", "registration");
    r.replica_size = field<int>(j, "replica_size", "registration");
    r.incarnation = field<std::string>(j, "incarnation", "registration");
    r.timing.heartbeat_ms = j.value("heartbeat_ms", r.timing.heartbeat_ms);
    r.timing.failure_timeout_ms = j.value("failure_timeout_ms", r.timing.failure_timeout_ms);
    r.timing.min_replicas = j.value("min_replicas", r.timing.min_replicas);
    r.last_generation = j.value("last_generation", int64_t{0});
    r.trained_in = j.value("trained_in", int64_t{0});
    r.last_members = j.value("last_members", 0);
  } catch (const json::exception& e) {
    throw std::runtime_error("malformed elastic registration record: " + std::string(e.what()));
  }
  // Bounded: a standby numbers its generations above the largest last_generation it reads.
  if (r.rank < 0 || r.replica < 0 || r.replica_size < 1 || r.last_generation < 0 || r.last_generation >= kPoison ||
      r.trained_in < 0 || r.trained_in > r.last_generation || r.last_members < 0 || r.last_members > (1 << 20))
    throw std::runtime_error("elastic registration record out of range (a negative rank or replica, or generations "
                             "beyond bounds or out of order): " + text.substr(0, 80));
  return r;
}

int Generation::index_of(int rank) const {
  auto it = std::lower_bound(ranks.begin(), ranks.end(), rank);
  return it != ranks.end() && *it == rank ? static_cast<int>(it - ranks.begin()) : -1;
}

bool Generation::has_replica(int replica) const {
  return std::binary_search(replicas.begin(), replicas.end(), replica);
}

std::string encode_generation(const Generation& g) {
  json inc = json::object();
  for (const auto& [rank, id] : g.incarnations) inc[std::to_string(rank)] = id;
  return json{{"id", g.id}, {"replicas", g.replicas}, {"ranks", g.ranks}, {"survivors", g.survivors},
              {"incarnations", inc}, {"reason", g.reason}}
      .dump();
}

Generation decode_generation(const std::string& text) {
  const json j = parse(text, "generation");
  Generation g;
  try {
    g.id = field<int64_t>(j, "id", "generation");
    g.replicas = field<std::vector<int>>(j, "replicas", "generation");
    g.ranks = field<std::vector<int>>(j, "ranks", "generation");
    g.survivors = field<std::vector<int>>(j, "survivors", "generation");
    g.reason = field<std::string>(j, "reason", "generation");
    for (const auto& [rank, id] : j.at("incarnations").items()) g.incarnations[std::stoi(rank)] = id.get<std::string>();
  } catch (const std::exception& e) {
    throw std::runtime_error("malformed elastic generation record: " + std::string(e.what()));
  }
  if (!std::is_sorted(g.ranks.begin(), g.ranks.end()) || !std::is_sorted(g.replicas.begin(), g.replicas.end()))
    throw std::runtime_error("elastic generation record " + std::to_string(g.id) + " lists ranks out of order");
  return g;
}

namespace {

// Replica slot -> its registered ranks (alive or not).
std::map<int, std::vector<const Registration*>> by_replica(const MembershipView& v) {
  std::map<int, std::vector<const Registration*>> out;
  for (const auto& [rank, r] : v.registered) out[r.replica].push_back(&r);
  return out;
}

// A replica can be a member when every one of its ranks is registered and alive.
bool complete(const std::vector<const Registration*>& ranks, const MembershipView& v) {
  if (ranks.empty() || static_cast<int>(ranks.size()) != ranks.front()->replica_size) return false;
  return std::none_of(ranks.begin(), ranks.end(), [&](const Registration* r) { return v.dead.count(r->rank) > 0; });
}

// A member replica stays while its member processes are the registered ones and none of them is dead.
bool still_member(int replica, const std::vector<const Registration*>& ranks, const MembershipView& v) {
  if (!complete(ranks, v)) return false;
  for (const Registration* r : ranks) {
    auto it = v.current->incarnations.find(r->rank);
    if (it == v.current->incarnations.end() || it->second != r->incarnation) return false;
  }
  return true;
}

// Drops from a failure generation the replicas that hold no live state (joiners): they join again later.
void keep_only_holders(Generation& next, const Generation& holders) {
  Generation kept;
  kept.id = next.id;
  for (int replica : next.replicas)
    if (holders.has_replica(replica)) kept.replicas.push_back(replica);
  for (int replica : next.survivors)
    if (holders.has_replica(replica)) kept.survivors.push_back(replica);
  for (int rank : next.ranks) {  // a kept replica's ranks are the holders' own processes
    const std::string& incarnation = next.incarnations.at(rank);
    auto it = holders.incarnations.find(rank);
    if (it == holders.incarnations.end() || it->second != incarnation) continue;
    kept.ranks.push_back(rank);
    kept.incarnations[rank] = incarnation;
  }
  next.replicas = std::move(kept.replicas);
  next.survivors = std::move(kept.survivors);
  next.ranks = std::move(kept.ranks);
  next.incarnations = std::move(kept.incarnations);
}

// The ranks of `next` that trained in the takeover's reference generation (MembershipView::quorum_generation).
int voters(const Generation& next, const MembershipView& v) {
  int n = 0;
  for (int rank : next.ranks) {
    auto it = v.registered.find(rank);
    if (it != v.registered.end() && it->second.trained_in == v.quorum_generation) ++n;
  }
  return n;
}

}  // namespace

std::optional<Generation> next_generation(const MembershipView& v, int min_replicas) {
  const auto replicas = by_replica(v);
  // With no replica left (every one failed) the job starts over like the first generation: it waits for all
  // ranks, or for min_replicas once the settle time has passed, rather than growing one replica at a time.
  const bool first = v.current == nullptr || v.current->id == 0 || v.current->replicas.empty();
  const bool restart = first && v.current != nullptr && v.current->id > 0;
  Generation next;
  next.id = v.current == nullptr ? v.first_id : v.current->id + 1;
  bool lost = false, joined = false;
  for (const auto& [replica, ranks] : replicas) {
    const bool was = v.current != nullptr && v.current->has_replica(replica);
    const bool keep = was ? still_member(replica, ranks, v) : complete(ranks, v);
    if (was && !keep) lost = true;
    if (!was && keep) joined = true;
    if (!keep) continue;
    next.replicas.push_back(replica);
    if (was) next.survivors.push_back(replica);
    for (const Registration* r : ranks) {
      next.ranks.push_back(r->rank);
      next.incarnations[r->rank] = r->incarnation;
    }
  }
  // A member replica that no longer registers at all (should not happen: registrations are never deleted).
  if (!first)
    for (int replica : v.current->replicas)
      if (!replicas.count(replica)) lost = true;
  std::sort(next.ranks.begin(), next.ranks.end());
  const int count = static_cast<int>(next.replicas.size());
  if (first) {
    const bool everyone = count > 0 && static_cast<int>(next.ranks.size()) == v.world_size;
    const bool enough = count >= min_replicas && static_cast<int>(next.ranks.size()) >= v.min_start_ranks;
    if (!everyone && !(v.settle_elapsed && enough)) return std::nullopt;
    if (v.quorum_min > 0 && voters(next, v) < v.quorum_min) return std::nullopt;
    next.reason = restart ? "restart" : "start";
    return next;
  }
  if (!lost && !joined) return std::nullopt;
  // Losing replicas cannot wait; joining ones wait until at least min_replicas can train.
  if (!lost && count < min_replicas) return std::nullopt;
  next.reason = lost ? "failure" : "join";
  if (lost && v.holders != nullptr) keep_only_holders(next, *v.holders);
  return next;
}

Takeover takeover_quorum(const std::map<int, Registration>& registered, int world_size) {
  Takeover t;
  int64_t newest = 0;
  int members = 0;
  for (const auto& [rank, r] : registered) {
    newest = std::max(newest, r.last_generation);
    // The newest generation someone started (a rank that knew of a newer, unstarted one still trained in this one).
    if (r.last_members > 0 && r.trained_in > t.reference) t.reference = r.trained_in, members = r.last_members;
  }
  t.first_id = newest + 1;
  t.min_ranks = t.reference > 0 ? members / 2 + 1 : std::max(1, world_size);
  return t;
}

void widen_window(std::vector<WindowGeneration>& window, const WindowGeneration& started) {
  for (const WindowGeneration& g : window)
    if (g.id == started.id) return;
  window.push_back(started);
  std::sort(window.begin(), window.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
}

void commit_in_window(std::vector<WindowGeneration>& window, int64_t id) {
  auto it = std::find_if(window.begin(), window.end(), [&](const WindowGeneration& g) { return g.id == id; });
  if (it == window.end()) return;
  it->committed = true;
  window.erase(window.begin(), it);
}

bool primary_keeps_quorum(const std::vector<WindowGeneration>& window,
                          const std::function<bool(int, const std::string&)>& holds, int members, int world_size) {
  if (window.empty()) return 2 * members >= world_size;
  for (const WindowGeneration& g : window) {
    const auto held = std::count_if(g.incarnations.begin(), g.incarnations.end(),
                                    [&](const auto& member) { return holds(member.first, member.second); });
    if (2 * held < static_cast<int64_t>(g.incarnations.size())) return false;
  }
  return true;
}

std::string encode_decision(const Decision& d) {
  return std::string(!d.commit ? "abort " : d.stop ? "stop " : "commit ") + std::to_string(d.next_generation);
}

Decision decode_decision(const std::string& text) {
  Decision d;
  const auto space = text.find(' ');
  const std::string verb = text.substr(0, space);
  if ((verb != "commit" && verb != "stop" && verb != "abort") || space == std::string::npos)
    throw std::runtime_error("malformed elastic step decision '" + text.substr(0, 40) + "'");
  d.commit = verb != "abort";
  d.stop = verb == "stop";
  try {
    size_t used = 0;
    d.next_generation = std::stoll(text.substr(space + 1), &used);
    if (used != text.size() - space - 1) throw std::invalid_argument("trailing");
  } catch (const std::exception&) {
    throw std::runtime_error("malformed elastic step decision '" + text.substr(0, 40) + "'");
  }
  if (!d.commit && d.next_generation < 1) throw std::runtime_error("elastic abort decision names no generation");
  return d;
}

std::vector<uint8_t> to_bytes(const std::string& text) { return std::vector<uint8_t>(text.begin(), text.end()); }
std::string from_bytes(const std::vector<uint8_t>& bytes) { return std::string(bytes.begin(), bytes.end()); }

int64_t unix_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string log_time(int64_t ms) {
  const std::time_t seconds = static_cast<std::time_t>(ms / 1000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[40];
  std::snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", utc.tm_year + 1900, utc.tm_mon + 1,
                utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, static_cast<int>(ms % 1000));
  return text;
}

int64_t parse_log_time(const std::string& text) {
  std::tm utc{};
  int millis = -1;
  char zone = 0;
  const int fields = std::sscanf(text.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d.%3d%c", &utc.tm_year, &utc.tm_mon,
                                 &utc.tm_mday, &utc.tm_hour, &utc.tm_min, &utc.tm_sec, &millis, &zone);
  if (fields != 8 || zone != 'Z' || text.size() != 24 || millis < 0)
    throw std::runtime_error("'" + text.substr(0, 40) + "' is not a log time like 2026-12-06T09:14:44.123Z");
  utc.tm_year -= 1900;
  utc.tm_mon -= 1;
  return static_cast<int64_t>(timegm(&utc)) * 1000 + millis;
}

std::string registration_key(int rank) { return "elastic/register/" + std::to_string(rank); }
std::string heartbeat_key(int rank) { return "elastic/heartbeat/" + std::to_string(rank); }
std::string generation_key(int64_t id) { return "elastic/generation/" + std::to_string(id); }
std::string stop_key() { return "elastic/stop"; }
std::string roster_key() { return "elastic/roster"; }
std::string latest_generation_key() { return "elastic/generation/latest"; }
std::string first_generation_key() { return "elastic/generation/first"; }
std::string vote_key(int64_t generation, int64_t step) {
  return "elastic/vote/" + std::to_string(generation) + "/" + std::to_string(step);
}
std::string decision_key(int64_t generation, int64_t step) {
  return "elastic/decision/" + std::to_string(generation) + "/" + std::to_string(step);
}

std::string start_key(int64_t generation) { return "elastic/start/" + std::to_string(generation); }
std::string done_key(int rank) { return "elastic/done/" + std::to_string(rank); }
std::string finished_key() { return "elastic/finished"; }
std::string exited_key(int rank) { return "elastic/exited/" + std::to_string(rank); }
std::string exits_key() { return "elastic/exits"; }
std::string exclude_key(int rank) { return "elastic/exclude/" + std::to_string(rank); }
std::string exclusions_key() { return "elastic/exclusions"; }

std::string accusation_key(int64_t generation, int accuser) {
  return "elastic/accusation/" + std::to_string(generation) + "/" + std::to_string(accuser);
}
std::string accusations_key() { return "elastic/accusations"; }

// "RANK INCARNATION\nWHY": the incarnation holds no space or newline (incarnation_of), the reason is the rest.
std::string encode_accusation(const Accusation& a) {
  std::string why = a.why.substr(0, kMaxAccusationWhy);
  std::replace(why.begin(), why.end(), '\n', ' ');
  return std::to_string(a.accused) + " " + a.incarnation + "\n" + why;
}

Accusation decode_accusation(const std::string& text) {
  const auto malformed = [&] { return std::runtime_error("malformed elastic accusation '" + text.substr(0, 40) + "'"); };
  const auto space = text.find(' '), newline = text.find('\n');
  if (space == std::string::npos || newline == std::string::npos || newline < space ||
      text.size() - newline - 1 > kMaxAccusationWhy)
    throw malformed();
  const std::string rank = text.substr(0, space);
  if (rank.empty() || rank.size() > 7 || rank.find_first_not_of("0123456789") != std::string::npos) throw malformed();
  Accusation a;
  a.accused = std::stoi(rank);
  a.incarnation = text.substr(space + 1, newline - space - 1);
  a.why = text.substr(newline + 1);
  if (a.accused < 0 || a.incarnation.empty() || pid_of_incarnation(a.incarnation) < 0) throw malformed();
  return a;
}

int parse_pid(const std::string& text) {
  if (text.empty() || text.size() > 9 || text.find_first_not_of("0123456789") != std::string::npos) return -1;
  const int pid = std::stoi(text);
  return pid > 0 ? pid : -1;
}

}  // namespace crosstrain::elastic
