#include "crosstrain/elastic/coordinator.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <sstream>

namespace crosstrain::elastic {
namespace {

// Between looks at the store's heartbeats and counters (each look costs about 2 x world + 4 store operations on
// the launcher's cores, which the ranks share): a reaped rank wakes the coordinator at once instead.
constexpr std::chrono::milliseconds kTick{20};



std::string join(const std::vector<int>& values) {
  std::string out;
  for (int v : values) out += (out.empty() ? "" : ",") + std::to_string(v);
  return out;
}

}  // namespace

Coordinator::Coordinator(c10::intrusive_ptr<c10d::Store> store, CoordinatorOptions options)
    : store_(std::move(store)), options_(std::move(options)), detector_(std::chrono::milliseconds(500)) {
  thread_ = std::thread([this] { loop(); });
}

Coordinator::~Coordinator() {
  {
    std::lock_guard<std::mutex> lock(exited_mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Coordinator::rank_exited(int rank) {
  {
    std::lock_guard<std::mutex> lock(exited_mu_);
    exited_.push_back(rank);
  }
  wake_.notify_all();
}

void Coordinator::loop() {
  while (!stop_) {
    try {
      tick(Clock::now());
    } catch (const std::exception& e) {
      // The store is in this process; an error here is a bug or a closed store (shutdown): report it once a tick.
      if (options_.log) options_.log(std::string("coordinator error: ") + e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    std::unique_lock<std::mutex> lock(exited_mu_);
    wake_.wait_for(lock, kTick, [&] { return stop_.load() || !exited_.empty(); });
  }
}

void Coordinator::read_registrations() {
  for (int rank = 0; rank < options_.world_size; ++rank) {
    const std::string key = registration_key(rank);
    if (!store_->check({key})) continue;
    Registration r;
    try {
      r = decode_registration(from_bytes(store_->get(key)));
    } catch (const std::exception& e) {
      continue;  // a half-written or hostile record is ignored, the rank stays unregistered
    }
    auto it = registered_.find(rank);
    if (it != registered_.end() && it->second.incarnation == r.incarnation) continue;
    if (registered_.empty()) {
      first_registration_ = Clock::now();
      timing_ = r.timing;
      detector_.set_timeout(std::chrono::milliseconds(timing_.failure_timeout_ms));
    }
    registered_[rank] = r;
  }
}

void Coordinator::observe_heartbeats(Clock::time_point now) {
  std::vector<std::pair<int, int>> exited;
  {
    std::lock_guard<std::mutex> lock(exited_mu_);
    for (int rank : exited_) {
      auto it = registered_.find(rank);
      if (it != registered_.end()) exited.push_back({rank, pid_of_incarnation(it->second.incarnation)});
    }
    exited_.clear();
  }
  for (const auto& reported : reported_exits()) exited.push_back(reported);
  for (const auto& [rank, r] : registered_)
    detector_.observe(rank, r.incarnation, store_->add(heartbeat_key(rank), 0), now);
  for (const auto& [rank, pid] : exited) {
    detector_.exited(rank, pid);  // the registered process only
    exited_pids_.insert({rank, pid});  // any: a restart's registration may have come first (keeps_quorum)
  }
}

std::vector<std::pair<int, int>> Coordinator::reported_exits() {
  std::vector<std::pair<int, int>> out;
  const int64_t exits = store_->add(exits_key(), 0);
  if (exits == exits_seen_) return out;
  exits_seen_ = exits;
  for (const auto& [rank, r] : registered_) {
    if (!store_->check({exited_key(rank)})) continue;
    // Any process of the rank: the detector heeds only the registered one's, the quorum any that exited here.
    const int pid = parse_pid(from_bytes(store_->get(exited_key(rank))));
    if (pid > 0) out.push_back({rank, pid});
  }
  return out;
}

void Coordinator::read_accusations() {
  const int64_t count = store_->add(accusations_key(), 0);
  if (count == accusations_seen_) return;
  accusations_seen_ = count;
  for (const Generation& g : open_)
    for (int accuser : g.ranks) {
      const std::string key = accusation_key(g.id, accuser);
      if (!store_->check({key})) continue;
      Accusation a;
      try {
        a = decode_accusation(from_bytes(store_->get(key)));
      } catch (const std::exception&) {
        continue;  // a half-written or hostile record accuses nobody
      }
      // Only a member about another member of the same generation, and only the process that was the member. When
      // both ends of a tampered link see the other's messages fail, the first accusation read stands: an accused
      // accuser is not heard (one of the two goes, not both).
      if (a.accused == accuser || g.index_of(a.accused) < 0 || g.incarnations.at(a.accused) != a.incarnation) continue;
      if (is_accused(a.accused, a.incarnation) || is_accused(accuser, g.incarnations.at(accuser))) continue;
      accused_[a.accused] = Accused{a.incarnation, accuser, a.why};
      if (options_.log)
        options_.log("[" + log_time(unix_ms()) + "] rank " + std::to_string(accuser) + " reports that rank " +
                     std::to_string(a.accused) + "'s messages did not authenticate in generation " +
                     std::to_string(g.id) + ": it is excluded (" + a.why + ")");
    }
}

bool Coordinator::is_accused(int rank, const std::string& incarnation) const {
  auto it = accused_.find(rank);
  return it != accused_.end() && it->second.incarnation == incarnation;
}

void Coordinator::tick(Clock::time_point now) {
  if (finishing_) return;
  // Registrations and finished ranks move the roster counter: their records are read only then.
  const int64_t roster = store_->add(roster_key(), 0);
  const bool roster_moved = roster != roster_seen_;
  roster_seen_ = roster;
  for (const auto& [rank, r] : registered_)
    if (roster_moved && store_->check({done_key(rank)})) {
      finishing_ = true;  // training is over: ranks leaving now are not failures
      store_->set(finished_key(), to_bytes("1"));
      if (options_.log) options_.log("[" + log_time(unix_ms()) + "] training finished on rank " +
                                     std::to_string(rank) + "; the membership no longer changes");
      return;
    }
  observe_heartbeats(now);  // exits first: a restarted rank's new registration must not inherit them
  if (roster_moved) {
    read_registrations();
    observe_heartbeats(now);
  }
  if (options_.quorum) refresh_window();
  // Generations superseded by one their members already started take no more votes. (Before view.current points
  // into open_: the erase moves its elements.)
  while (open_.size() > 1 && store_->check({start_key(open_[1].id)})) open_.erase(open_.begin());
  MembershipView view;
  view.current = open_.empty() ? nullptr : &open_.back();
  for (auto it = open_.rbegin(); it != open_.rend() && view.holders == nullptr; ++it)
    if (it->reason != "join" || store_->check({start_key(it->id)})) view.holders = &*it;
  view.registered = registered_;
  view.world_size = options_.world_size;
  view.min_start_ranks = options_.min_start_ranks;
  if (options_.takeover && open_.empty()) {
    const Takeover t = takeover_quorum(registered_, options_.world_size);
    view.first_id = t.first_id;
    view.quorum_generation = t.reference;
    view.quorum_min = t.min_ranks;
    // A job that trained is past its start's rule (--nnodes MIN:MAX's MIN nodes: every node with N:N, which node 0's
    // loss can never meet again): a majority of the members it last trained with is what counts.
    if (t.reference > 0) view.min_start_ranks = 0;
  }
  // The settle time counts from the first registration, or from the moment the last replica was lost. A standby's
  // waits two failure timeouts: the ranks that came over found the store gone within about that of each other, and
  // a later one joins the running generation.
  const auto settle = options_.takeover && open_.empty()
                          ? std::min<std::chrono::milliseconds>(options_.settle, 2 * std::chrono::milliseconds(timing_.failure_timeout_ms))
                          : options_.settle;
  view.settle_elapsed = !registered_.empty() && now - std::max(first_registration_, emptied_) >= settle;
  read_accusations();
  for (const auto& [rank, r] : registered_)
    if (detector_.dead(rank, r.incarnation, now) || is_accused(rank, r.incarnation)) view.dead.insert(rank);
  auto next = next_generation(view, std::max(1, timing_.min_replicas));
  if (!next) return;
  // One join at a time: a second one before the first has started could send joiners and members to different
  // generations. Failures never wait.
  const bool join_pending = !open_.empty() && open_.back().reason == "join" && !store_->check({start_key(open_.back().id)});
  if (next->reason == "join" && join_pending) return;
  if (next->failure() && options_.quorum && !keeps_quorum(*next, view)) return;
  if (options_.takeover && open_.empty()) {
    next->reason = "takeover";
    // Before the generation itself: a rank that finds the generation finds where the standby's ids begin.
    store_->set(first_generation_key(), to_bytes(std::to_string(next->id)));
  }
  publish(*next, now, view.holders);
}

// The start step a member wrote for generation `id`, or -1 (none yet, closed, or not a step).
int64_t Coordinator::start_step(int64_t id) const {
  if (!store_->check({start_key(id)})) return -1;
  const std::string start = from_bytes(store_->get(start_key(id)));
  try {
    size_t used = 0;
    const int64_t step = std::stoll(start, &used);
    return used == start.size() && step >= 0 ? step : -1;
  } catch (const std::exception&) {
    return -1;  // "closed", or a record that is not a step
  }
}

// With a standby (options_.quorum): the generations a failure must keep half of (primary_keeps_quorum). Before the
// tick drops superseded generations from open_: a join that started must not take the committed one's place.
void Coordinator::refresh_window() {
  for (const Generation& g : open_)
    if (std::none_of(window_.begin(), window_.end(), [&](const WindowGeneration& w) { return w.id == g.id; }) &&
        start_step(g.id) >= 0)
      widen_window(window_, WindowGeneration{g.id, g.incarnations, false});
  for (auto it = window_.rbegin(); it != window_.rend() && !it->committed; ++it) {
    const int64_t step = start_step(it->id);
    if (step < 0 || !store_->check({decision_key(it->id, step)})) continue;
    bool commit = false;
    try {
      commit = decode_decision(from_bytes(store_->get(decision_key(it->id, step)))).commit;
    } catch (const std::exception&) {
    }
    if (commit) {
      commit_in_window(window_, it->id);
      return;
    }
  }
}

// Whether the primary may publish `next`, a failure generation (primary_keeps_quorum). When the quorum holds, every
// open generation that no member started yet is closed before the answer, so that none can start unseen between
// this check and the publication; one that started meanwhile joins the window and the check is made again. When it
// fails nothing is published and open_ stays as it is (this side may be the cut-off minority while the others take
// over at the standby): its ranks wait until the lost ones answer again or are restarted here, or their own
// timeouts end them.
bool Coordinator::keeps_quorum(const Generation& next, const MembershipView& view) {
  refresh_window();
  const auto holds = [&](int rank, const std::string& then) {
    if (next.index_of(rank) >= 0 && next.incarnations.at(rank) == then) return true;
    auto it = registered_.find(rank);
    return it != registered_.end() && it->second.incarnation != then && !view.dead.count(rank) &&
           exited_pids_.count({rank, pid_of_incarnation(then)}) > 0;
  };
  const auto quorum = [&] {
    return primary_keeps_quorum(window_, holds, static_cast<int>(next.ranks.size()), options_.world_size);
  };
  bool ok = quorum();
  if (ok) {
    bool widened = false;
    for (const Generation& g : open_) {
      if (closed_.count(g.id)) continue;
      if (from_bytes(store_->compareSet(start_key(g.id), {}, to_bytes(kClosed))) == kClosed) continue;
      widen_window(window_, WindowGeneration{g.id, g.incarnations, false});  // started just now
      widened = true;
    }
    ok = !widened || quorum();  // closed meanwhile but refused: those never start; the ranks' timeouts end them
  }
  if (ok) {
    no_quorum_said_.clear();
    return true;
  }
  std::ostringstream line;
  line << "no quorum: generation " << next.id << " would keep " << next.ranks.size() << " rank"
       << (next.ranks.size() == 1 ? "" : "s") << " of";
  for (const WindowGeneration& g : window_) line << " generation " << g.id << "'s " << g.incarnations.size() << ",";
  if (window_.empty()) line << " the job's " << options_.world_size << ",";
  line << " and a standby exists: at least half must stay here; nothing is published (the others may go on at the "
          "standby)";
  if (line.str() != no_quorum_said_ && options_.log) options_.log("[" + log_time(unix_ms()) + "] " + line.str());
  no_quorum_said_ = line.str();
  return false;
}

std::string Coordinator::describe_losses(const Generation& next, Clock::time_point now, const Generation* holders) const {
  if (open_.empty()) return "";
  std::ostringstream out;
  for (int rank : open_.back().ranks) {
    if (next.index_of(rank) >= 0 && next.incarnations.at(rank) == open_.back().incarnations.at(rank)) continue;
    auto it = registered_.find(rank);
    out << "; rank " << rank;
    if (it == registered_.end() || it->second.incarnation != open_.back().incarnations.at(rank))
      out << " restarted";
    else if (is_accused(rank, it->second.incarnation))
      out << " excluded: its messages to rank " << accused_.at(rank).accuser << " did not authenticate";
    else if (waits_to_join(rank, it->second.incarnation, holders, now))
      out << " joins again later (it was still healing)";
    else if (!detector_.dead(rank, it->second.incarnation, now))
      out << " left with its replica " << it->second.replica;
    else if (detector_.silent_for(rank, now).count() >= timing_.failure_timeout_ms)
      out << " silent for " << detector_.silent_for(rank, now).count() << " ms";
    else
      out << " exited";
  }
  return out.str();
}

// A live joiner that a failure generation left out because it holds no state yet: it stays registered and comes
// back in the next join (ending it would cost it its whole start again).
bool Coordinator::waits_to_join(int rank, const std::string& member, const Generation* holders,
                                Clock::time_point now) const {
  if (holders == nullptr || holders->index_of(rank) >= 0) return false;
  auto it = registered_.find(rank);
  return it != registered_.end() && it->second.incarnation == member && !detector_.dead(rank, member, now);
}

void Coordinator::publish(const Generation& next, Clock::time_point now, const Generation* holders) {
  const Generation* current = open_.empty() ? nullptr : &open_.back();
  std::vector<std::pair<int, int>> excluded;
  if (current)
    for (int rank : current->ranks) {
      const std::string& member = current->incarnations.at(rank);
      if (next.index_of(rank) >= 0 && next.incarnations.at(rank) == member) continue;
      if (waits_to_join(rank, member, holders, now)) continue;
      if (!detector_.has_exited(rank, member)) excluded.push_back({rank, pid_of_incarnation(member)});
    }
  const std::string losses = describe_losses(next, now, holders);
  // The launcher ends the excluded processes: none of them may be admitted again (the rest of a failed replica
  // would otherwise rejoin with its restarted rank before the launcher has ended it).
  for (const auto& [rank, pid] : excluded) {
    auto it = registered_.find(rank);
    if (it != registered_.end() && it->second.incarnation == current->incarnations.at(rank))
      detector_.exited(rank, pid_of_incarnation(it->second.incarnation));
  }
  // For the launchers of other nodes (this one's hears through options_.exclude below).
  for (const auto& [rank, pid] : excluded) store_->set(exclude_key(rank), to_bytes(std::to_string(pid)));
  if (!excluded.empty()) store_->add(exclusions_key(), 1);
  store_->set(generation_key(next.id), to_bytes(encode_generation(next)));
  store_->set(latest_generation_key(), to_bytes(std::to_string(next.id)));
  published_ = next.id;
  if (next.failure()) {
    for (const auto& g : open_)
      if (!closed_.count(g.id)) close_generation(g, next.id);
    open_.clear();
  }
  open_.push_back(next);
  if (next.replicas.empty()) emptied_ = now;
  if (options_.log) {
    std::ostringstream line;
    line << "[" << log_time(unix_ms()) << "] generation " << next.id << " (" << next.reason << "): " << next.replicas.size()
         << " replica" << (next.replicas.size() == 1 ? "" : "s") << " (" << join(next.replicas) << "), "
         << next.ranks.size() << " rank" << (next.ranks.size() == 1 ? "" : "s") << losses;
    options_.log(line.str());
  }
  if (!excluded.empty() && options_.exclude) options_.exclude(excluded, "left generation " + std::to_string(next.id));
}

// Ends generation `g`: the first step its members have not all voted for is aborted (they redo it in
// `successor`); a generation no member started yet can no longer be started.
void Coordinator::close_generation(const Generation& g, int64_t successor) {
  closed_.insert(g.id);
  const std::string start = from_bytes(store_->compareSet(start_key(g.id), {}, to_bytes(kClosed)));
  if (start == kClosed) return;
  const int64_t members = static_cast<int64_t>(g.ranks.size());
  int64_t step = std::stoll(start);
  for (int64_t guard = 0; guard < (int64_t{1} << 30); ++guard, ++step) {
    const int64_t before = store_->add(vote_key(g.id, step), kPoison) - kPoison;
    if (before >= members) continue;  // every member voted: that step committed
    if (step > std::stoll(start)) decide_committed(g.id, step - 1, successor);
    store_->set(decision_key(g.id, step), to_bytes(encode_decision({false, successor})));
    return;
  }
}

// The last committed step of a generation being closed. Its last voter writes the decision right after its vote,
// unless it died in between: then nobody would, and the members that voted waited for it until the store's timeout
// (and failed). Written here if absent, with the successor to move to; both writes are compare-and-set, so the
// first stands. Only this step can lack one: a member reads each decision before it votes on the next step.
void Coordinator::decide_committed(int64_t generation, int64_t step, int64_t successor) {
  Decision d;
  d.commit = true;
  d.stop = store_->check({stop_key()});
  d.next_generation = successor;
  (void)store_->compareSet(decision_key(generation, step), {}, to_bytes(encode_decision(d)));
}

}  // namespace crosstrain::elastic
