#include "elastic_supervisor.h"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <iostream>

#include "crosstrain/elastic/membership_logic.h"

namespace crosstrain::apps {

namespace {

// The whole line in one write: the coordinator's thread prints beside the launcher's, and a line written in pieces
// comes out cut by the other's.
void say(const std::string& line) { std::cerr << line + "\n" << std::flush; }

}  // namespace

bool store_answers(const StoreAddress& at, int world_size, bool took_over) {
  try {
    auto store = comm::Rendezvous::connect(at.host, at.port, -1, world_size, std::chrono::milliseconds(1000), at.job);
    return !took_over || store->store()->check({elastic::first_generation_key()});
  } catch (const std::exception&) {
    return false;
  }
}

ElasticSupervisor::ElasticSupervisor(const ElasticLaunch& options, int world_size, int min_start_ranks,
                                     std::shared_ptr<comm::Rendezvous> store, StoreAddress remote, Standby standby)
    : options_(options), world_size_(world_size), min_start_ranks_(min_start_ranks), remote_(std::move(remote)),
      standby_(std::move(standby)) {
  if (!store) {
    if (!remote_.host.empty()) link_ = std::thread([this] { link_loop(); });
    return;
  }
  coordinator_ = std::make_unique<elastic::Coordinator>(store->store(), coordinator_options(false));
}

elastic::CoordinatorOptions ElasticSupervisor::coordinator_options(bool takeover) {
  elastic::CoordinatorOptions c;
  c.world_size = world_size_;
  c.min_start_ranks = min_start_ranks_;
  c.takeover = takeover;
  // Node 0 of a job with a standby: a cut-off minority here must not train on beside the standby's majority.
  c.quorum = !takeover && standby_.port > 0;
  c.exclude = [this](const std::vector<std::pair<int, int>>& processes, const std::string&) {
    std::lock_guard<std::mutex> lock(mu_);
    excluded_.insert(excluded_.end(), processes.begin(), processes.end());
  };
  c.log = [](const std::string& line) { say("crosstrain elastic: " + line); };
  return c;
}

ElasticSupervisor::~ElasticSupervisor() {
  stop_ = true;
  if (link_.joinable()) link_.join();
}

void ElasticSupervisor::link_loop() {
  std::shared_ptr<comm::Rendezvous> store;
  bool warned = false;
  elastic::Clock::time_point unreachable_since{};
  while (!stop_) {
    try {
      // A short timeout: node 0 may not be up yet, and this thread must notice stop_ soon.
      if (!store) store = comm::Rendezvous::connect(remote_.host, remote_.port, -1, world_size_,
                                                    std::chrono::milliseconds(2000), remote_.job);
      link_once(*store->store());
      unreachable_since = {};
    } catch (const std::exception& e) {
      store.reset();
      const auto now = elastic::Clock::now();
      if (unreachable_since == elastic::Clock::time_point{}) unreachable_since = now;
      // Once reached, a store unreachable for kTakeoverAfter may be lost: the standby's turn. (Or this node is cut
      // off from it: node 1's coordinator then never gets its quorum, and the others keep trying node 0.) A node
      // other than node 1 follows a standby that took over even if it never reached node 0 (started late).
      const bool may = reached_ || !standby_.store;
      if (standby_.port > 0 && may && now - unreachable_since >= kTakeoverAfter && try_standby()) {
        unreachable_since = {};
        warned = false;
        continue;
      }
      // The job goes on without it: exits are then detected by the heartbeats, exclusions end in the ranks' own
      // timeouts. Said once; it keeps trying.
      if (!warned)
        say("crosstrain run: cannot reach the job's store at " + remote_.host + ":" + std::to_string(remote_.port) +
            " to report exits and hear of exclusions (" + e.what() + "); retrying");
      warned = true;
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      continue;
    }
    reached_ = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

bool ElasticSupervisor::standby_started() {
  try {
    if (standby_.store) return standby_.store->store()->check({elastic::first_generation_key()});
    auto standby = comm::Rendezvous::connect(standby_.host, standby_.port, -1, world_size_,
                                             std::chrono::milliseconds(2000), remote_.job);
    return standby->store()->check({elastic::first_generation_key()});
  } catch (const std::exception&) {
    return false;  // unreachable as well: this node is cut off
  }
}

// Node 1 starts the standby's coordinator once (it publishes only with a majority of the last members, so a node 1
// merely cut off from node 0 starts nothing) and goes on reporting to node 0 should it answer again. The others
// move to the standby's store only once its coordinator started a generation: a cut link moves nobody.
bool ElasticSupervisor::try_standby() {
  const std::string lost = remote_.host + ":" + std::to_string(remote_.port);
  const std::string standby = standby_.host + ":" + std::to_string(standby_.port);
  if (standby_.store) {
    std::lock_guard<std::mutex> lock(mu_);
    if (coordinator_) return false;
    say("crosstrain run: [" + elastic::log_time(elastic::unix_ms()) + "] node 0's store at " + lost +
        " does not answer; the standby coordinator at " + standby +
        " takes over once a majority of the last generation's ranks come over");
    coordinator_ = std::make_unique<elastic::Coordinator>(standby_.store->store(), coordinator_options(true));
    for (const auto& [rank, pid] : exits_to_report_) coordinator_->rank_exited(rank);
    return false;  // node 0 may answer again: keep trying it
  }
  if (!standby_started()) return false;
  say("crosstrain run: [" + elastic::log_time(elastic::unix_ms()) + "] node 0's store at " + lost +
      " is gone and the standby took over; reporting to the standby at " + standby);
  std::lock_guard<std::mutex> lock(mu_);
  standby_took_over_ = true;
  remote_.host = standby_.host;
  remote_.port = standby_.port;
  standby_.port = 0;
  exclusions_seen_ = 0;
  reached_ = false;
  return true;
}

void ElasticSupervisor::link_once(c10d::Store& store) {
  std::vector<std::pair<int, int>> exits;
  {
    std::lock_guard<std::mutex> lock(mu_);
    exits = exits_to_report_;
  }
  for (const auto& [rank, pid] : exits) store.set(elastic::exited_key(rank), elastic::to_bytes(std::to_string(pid)));
  if (!exits.empty()) {
    store.add(elastic::exits_key(), 1);
    std::lock_guard<std::mutex> lock(mu_);
    exits_to_report_.erase(exits_to_report_.begin(), exits_to_report_.begin() + static_cast<std::ptrdiff_t>(exits.size()));
  }
  // Now and then (a store call for this launcher alone): has training finished? A rank that fails after that is
  // not restarted (node 0's store goes away with its launcher, and a restarted rank could only wait for it).
  if (++looks_ % 25 == 0 && store.check({elastic::finished_key()})) finished_ = true;
  const int64_t exclusions = store.add(elastic::exclusions_key(), 0);
  if (exclusions == exclusions_seen_) return;
  exclusions_seen_ = exclusions;
  for (int rank : remote_.ranks) {
    if (!store.check({elastic::exclude_key(rank)})) continue;
    const int pid = elastic::parse_pid(elastic::from_bytes(store.get(elastic::exclude_key(rank))));
    if (pid <= 0 || excluded_pid_[rank] == pid) continue;
    excluded_pid_[rank] = pid;
    // end_excluded() ends it only if it is still this launcher's child with that pid.
    std::lock_guard<std::mutex> lock(mu_);
    excluded_.push_back({rank, pid});
  }
}

bool ElasticSupervisor::on_failure(int rank, pid_t pid, const std::string& how) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (coordinator_) coordinator_->rank_exited(rank);  // node 0's, or node 1's standby once it runs
    if (link_.joinable()) exits_to_report_.push_back({rank, static_cast<int>(pid)});  // to node 0's store
  }
  if (finished_) {
    say("crosstrain run: rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ") failed with " + how +
        " after the job finished training; not restarting it");
    return false;
  }
  if (restarts_ >= options_.max_restarts) {
    say("crosstrain run: rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ") failed with " + how +
        "; no restarts left (--max-restarts " + std::to_string(options_.max_restarts) + "), the job goes on without it");
    return false;
  }
  ++restarts_;
  say("crosstrain run: rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ") failed with " + how +
      "; restarting it (" + std::to_string(restarts_) + " of " + std::to_string(options_.max_restarts) + " restarts)");
  return true;
}

std::optional<std::pair<std::string, int>> ElasticSupervisor::store_for_restarts() {
  if (standby_.store) {  // node 1: once its coordinator started a generation
    std::lock_guard<std::mutex> lock(mu_);
    if (!coordinator_ || !standby_started()) return std::nullopt;
    return std::make_pair(standby_.host, standby_.port);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!standby_took_over_) return std::nullopt;
  return std::make_pair(remote_.host, remote_.port);
}

std::vector<std::pair<int, int>> ElasticSupervisor::take_exclusions() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<int, int>> out;
  out.swap(excluded_);
  return out;
}

}  // namespace crosstrain::apps
