#include "crosstrain/scheduler/scheduler.h"

#include <algorithm>
#include <iterator>
#include <chrono>
#include <cmath>
#include <limits>

#include "crosstrain/core/error.h"

namespace crosstrain::scheduler {
namespace {

double wall_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double epoch_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The devices a placement holds: its shares that run now.
std::vector<std::pair<std::string, int>> shares_of(const PlacementRecord& p) {
  std::vector<std::pair<std::string, int>> out;
  for (const auto& s : p.shares)
    if (!s.absent) out.push_back({s.cluster, s.ranks});
  return out;
}

std::string describe(const PlacementRecord& p) {
  std::string s;
  for (const auto& sh : p.shares)
    s += std::string(s.empty() ? "" : " + ") + (sh.absent ? "(" : "") + sh.cluster + ":" + std::to_string(sh.ranks) +
         (sh.absent ? " absent)" : "");
  return s + " [" + p.layout + "] " + planner::to_string(p.sync);
}

// The cluster and its device type alone, as a planner cluster file (the clusters table's spec column).
std::string cluster_toml(const Registry& r, int i) {
  planner::ClusterFile one;
  one.name = r.file().clusters[i].name;
  one.clusters.push_back(r.file().clusters[i]);
  one.devices.emplace(one.clusters[0].device, r.file().device_of(one.clusters[0]));
  return planner::to_toml(one);
}

// The same devices, speed, memory, price and power (a spec read back from the state file may differ in the last
// bits of its numbers).
bool same_cluster(const ClusterInfo& a, const ClusterInfo& b) {
  auto close = [](double x, double y) { return std::abs(x - y) <= 1e-9 * std::max(std::abs(x), std::abs(y)); };
  return a.name == b.name && a.device == b.device && a.devices == b.devices && a.devices_per_host == b.devices_per_host &&
         close(a.peak_flops, b.peak_flops) && close(a.memory_bytes, b.memory_bytes) &&
         close(a.price_per_device_hour, b.price_per_device_hour) && close(a.power_w, b.power_w);
}

comm::Link plain_link(double latency_s, double bandwidth_Bps) {
  comm::Link l;
  l.latency_s = latency_s, l.bandwidth_Bps = bandwidth_Bps;
  return l;
}

}  // namespace

Scheduler::Scheduler(Registry registry, StateStore& store, Executor& executor, SchedulerOptions options, Clock clock)
    : registry_(std::move(registry)), store_(store), executor_(executor), options_(std::move(options)),
      clock_(clock ? std::move(clock) : Clock(epoch_s)) {
  if (store_.clusters().empty())
    persist_registry();
  else
    recover();
}

void Scheduler::persist_registry() {
  StateStore::Transaction t(store_);
  for (int i = 0; i < registry_.size(); ++i) store_.put_cluster({registry_.info(i).name, registry_.up(i), cluster_toml(registry_, i)});
  const planner::ClusterFile& f = registry_.file();
  store_.put_link({"*", "*", f.wan.latency_s, f.wan.bandwidth_Bps});
  for (const auto& w : f.wan_links) store_.put_link({w.a, w.b, w.link.latency_s, w.link.bandwidth_Bps});
  t.commit();
}

// The registry and the jobs as the file has them; every placed or running job holds its devices again.
void Scheduler::recover() {
  Registry r;
  for (const ClusterRow& row : store_.clusters()) {
    const planner::ClusterFile one = planner::parse_cluster(row.spec_toml, store_.path() + " (cluster " + row.name + ")");
    r.add_cluster(one.clusters.at(0), one.device_of(one.clusters.at(0)));
    r.set_up(row.name, row.up);
  }
  for (const LinkRow& l : store_.links()) {
    if (l.a == "*")
      r.set_default_link(plain_link(l.latency_s, l.bandwidth_Bps));
    else
      r.set_link(l.a, l.b, plain_link(l.latency_s, l.bandwidth_Bps));
  }
  registry_ = std::move(r);
  for (JobRecord& j : store_.jobs()) {
    const int64_t id = j.id;
    if (j.state == JobState::Queued) queue_.push_back(id);
    if (holds_devices(j.state)) {
      if (!j.placement || !registry_.reserve(shares_of(*j.placement)))
        throw Error("scheduler state '" + store_.path() + "': job " + std::to_string(id) +
                    " holds devices its placement cannot reserve again (the file is inconsistent)");
      active_.insert(id);
    }
    jobs_.emplace(id, std::move(j));
  }
}

int64_t Scheduler::submit(const JobSpec& spec) {
  JobRecord j;
  j.spec = spec;
  j.submitted_s = j.updated_s = now();
  const Decision ever = place(spec, progress_of(j, j.submitted_s), registry_.all_free(), options_.placement, &cache_);
  if (ever.verdict != Verdict::Placed) {
    j.state = JobState::Failed;
    j.reason = "rejected: can never run here: " + ever.reason;
    ++stats_.rejected;
  }
  StateStore::Transaction t(store_);
  j.id = store_.add_job(j);
  if (j.state == JobState::Failed) store_.add_event(j.updated_s, j.id, "rejected", j.reason);
  t.commit();
  if (j.state == JobState::Queued) queue_.push_back(j.id);
  const int64_t id = j.id;
  jobs_.emplace(id, std::move(j));
  return id;
}

bool Scheduler::try_place(JobRecord& job) {
  const double t0 = wall_s();
  // Cheap refusals: not enough free devices anywhere, or no device freed since this job was last refused (less
  // room and a nearer deadline never turn a refusal into a placement).
  auto refused = refused_at_.find(job.id);
  if (job.spec.least_ranks() > registry_.free_total() || (refused != refused_at_.end() && refused->second == freed_)) {
    ++stats_.refusals;
    return false;
  }
  Decision d = place(job.spec, progress_of(job, now()), registry_, options_.placement, &cache_);
  if (d.verdict != Verdict::Placed) {
    job.reason = d.reason;
    refused_at_[job.id] = freed_;
    ++stats_.refusals;
    return false;
  }
  const auto quota = options_.quotas.find(job.spec.user);
  if (quota != options_.quotas.end() && held_by(job.spec.user) + d.placement.present_ranks() > quota->second) {
    job.reason = "user " + job.spec.user + "'s quota: holds " + std::to_string(held_by(job.spec.user)) + " of " +
                 std::to_string(quota->second) + " devices, and this placement needs " +
                 std::to_string(d.placement.present_ranks());
    refused_at_[job.id] = freed_;
    ++stats_.refusals;
    return false;
  }
  refused_at_.erase(job.id);
  if (!registry_.reserve(shares_of(d.placement)))
    throw Error("placement of job " + std::to_string(job.id) + " on " + describe(d.placement) +
                " chose devices that are not free (a scheduler bug)");
  job.placement = d.placement;
  job.placement->attempt = ++job.attempts;
  const ClusterShare& first = job.placement->shares.front();
  job.placement->standby = job.placement->standby_possible(executor_.share_nodes(first.cluster, first.ranks)) &&
                           executor_.own_address(job.placement->shares[1].cluster);
  job.state = JobState::Placed;
  job.reason.clear();
  job.updated_s = now();
  StateStore::Transaction t(store_);
  store_.update_job(job);
  std::string why;
  for (const std::string& c : d.clusters) why += (why.empty() ? "" : "; ") + c;
  store_.add_event(job.updated_s, job.id, "placed", describe(*job.placement) + (why.empty() ? "" : " (" + why + ")"));
  t.commit();
  active_.insert(job.id);
  ++stats_.decisions;
  stats_.decision_s.push_back(wall_s() - t0);
  return true;
}

bool Scheduler::fits_up_clusters(const JobRecord& job) {
  auto it = fits_up_.find(job.id);
  if (it != fits_up_.end() && it->second.first == up_epoch_) return it->second.second;
  const bool fits = job.spec.least_ranks() <= registry_.capacity_total() &&
                    place(job.spec, progress_of(job, now()), registry_.all_free(), options_.placement, &cache_).verdict ==
                        Verdict::Placed;
  fits_up_[job.id] = {up_epoch_, fits};
  return fits;
}

void Scheduler::start(JobRecord& job) {
  try {
    executor_.start(job, *job.placement);
  } catch (const std::exception& e) {
    StateStore::Transaction t(store_);
    requeue_unstarted(job, e.what());
    t.commit();
    return;
  }
  job.state = JobState::Running;
  job.updated_s = now();
  for (ClusterShare& s : job.placement->shares)
    if (!s.absent) s.started_s = job.updated_s;
  StateStore::Transaction t(store_);
  store_.update_job(job);
  store_.add_event(job.updated_s, job.id, "started", "");
  t.commit();
}

// The executor started nothing: give the devices back and wait for the next pass (no restart is used).
void Scheduler::requeue_unstarted(JobRecord& job, const std::string& why) {
  if (job.placement)
    for (ClusterShare& s : job.placement->shares) s.started_s = -1;  // it never ran: nothing to bill
  release(job);
  job.state = JobState::Queued;
  job.reason = "start failed: " + why;
  job.updated_s = now();
  store_.update_job(job);
  store_.add_event(job.updated_s, job.id, "start-failed", why);
  queue_.push_back(job.id);
}

// A share started again to grow the job did not start (reported later by an executor that starts in the
// background): it stays absent, its devices go back, and it is tried again in a while, as when start_share throws.
void Scheduler::share_unstarted(JobRecord& job, size_t share, const std::string& why) {
  ClusterShare& s = job.placement->shares[share];
  if (s.absent) return;
  executor_.stop_share(job.id, share);
  s.absent = true;
  s.started_s = -1;
  registry_.release({{s.cluster, s.ranks}});
  ++freed_;
  grow_after_[{job.id, share}] = now() + 10;
  job.updated_s = now();
  store_.update_job(job);
  store_.add_event(job.updated_s, job.id, "grow-failed", s.cluster + ": " + why);
}

void Scheduler::account(const JobRecord& job, const ClusterShare& s) {
  if (s.absent || s.started_s < 0 || job.state != JobState::Running) return;
  store_.add_usage(job.spec.user, s.cluster, s.ranks * std::max(0.0, now() - s.started_s));
}

void Scheduler::release(JobRecord& job) {
  if (job.placement)
    for (const ClusterShare& s : job.placement->shares) account(job, s);
  if (job.placement) registry_.release(shares_of(*job.placement)), ++freed_;
  job.placement.reset();
  active_.erase(job.id);
  // What was waited for belongs to the placement: a new one starts with none.
  for (auto* waits : {&grow_after_, &down_since_})
    for (auto it = waits->begin(); it != waits->end();) it = it->first.first == job.id ? waits->erase(it) : std::next(it);
}

void Scheduler::finish(JobRecord& job, JobState state, const std::string& reason) {
  if (holds_devices(job.state)) release(job);
  job.state = state;
  job.reason = reason;
  job.updated_s = now();
  store_.update_job(job);
  store_.add_event(job.updated_s, job.id, to_string(state), reason);
}

void Scheduler::poll() {
  for (const std::string& c : executor_.lost_clusters())
    if (registry_.up(registry_.index_of(c))) mark_lost(c);
  StateStore::Transaction t(store_);  // one commit for the whole poll
  for (int64_t id : std::vector<int64_t>(active_.begin(), active_.end())) {
    JobRecord& job = jobs_.at(id);
    if (job.state != JobState::Running) continue;
    const ExecStatus s = executor_.status(id);
    if (s.kind == ExecStatus::Done) {
      job.step = job.spec.steps;
      finish(job, JobState::Done, "");
    } else if (s.kind == ExecStatus::Failed && s.start_failed && s.failed_share >= 0 && job.placement &&
               static_cast<size_t>(s.failed_share) < job.placement->shares.size()) {
      share_unstarted(job, static_cast<size_t>(s.failed_share), s.detail);
    } else if (s.kind == ExecStatus::Failed && s.start_failed) {
      requeue_unstarted(job, s.detail);
    } else if (s.kind == ExecStatus::Failed && s.failed_share >= 0 &&
               goes_on_without(job, static_cast<size_t>(s.failed_share))) {
      // The rest of an elastic job trains on without it; it is started again while restarts are left (not a share
      // 0 whose store moves with sites: it stays out, and costs no restart).
      const size_t share = static_cast<size_t>(s.failed_share);
      const bool stays_out = share == 0 && !job.placement->rendezvous_moved && executor_.has_sites(id);
      const bool again = !stays_out && job.restarts < job.spec.max_restarts;
      if (again) ++job.restarts;
      shrink(job, share,
             s.detail + (again       ? "; started again (restart " + std::to_string(job.restarts) + " of " +
                                         std::to_string(job.spec.max_restarts) + ")"
                         : stays_out ? ""
                                     : "; no restarts left, the job goes on without it"));
      if (!again) grow_after_[{id, share}] = std::numeric_limits<double>::infinity();
    } else if (s.kind == ExecStatus::Failed && job.restarts < job.spec.max_restarts) {
      restart(job, s);
    } else if (s.kind == ExecStatus::Failed) {
      finish(job, JobState::Failed, s.detail);
    } else if (s.checkpoint_step > job.step) {
      job.step = s.checkpoint_step;  // durable progress: where a re-placement resumes
      store_.update_job(job);
    }
  }
  t.commit();
}

// The gang failed (a crash, a preempted or killed share): stop what is left of it and queue it again from its
// newest checkpoint.
void Scheduler::restart(JobRecord& job, const ExecStatus& failure) {
  executor_.stop(job.id);
  job.step = std::max(job.step, failure.checkpoint_step);
  ++job.restarts;
  release(job);
  job.state = JobState::Queued;
  job.reason = "restart " + std::to_string(job.restarts) + " of " + std::to_string(job.spec.max_restarts) +
               " from step " + std::to_string(job.step) + " after: " + failure.detail;
  job.updated_s = now();
  store_.update_job(job);
  store_.add_event(job.updated_s, job.id, "restarted", job.reason);
  queue_.insert(queue_.begin(), job.id);
}

bool Scheduler::goes_on_without(const JobRecord& job, size_t share) const {
  if (!executor_.changes_shares() || !job.placement || !job.placement->live_elastic()) return false;
  const PlacementRecord& p = *job.placement;
  const auto& shares = p.shares;
  if (share >= shares.size() || shares[share].absent) return false;
  if (share == 0 && !p.rendezvous_moved) {
    // Share 0 holds the job's store: the standby on share 1's node takes it over, with a majority of the members
    // (the coordinator's rule: a cut-off minority never trains on alone). Once it did, share 0 is like the others.
    return p.standby && !shares[1].absent && 2 * shares[0].ranks < p.present_ranks();
  }
  if (share == 1 && p.rendezvous_moved) return false;  // the job's store lives there now
  for (size_t i = 0; i < shares.size(); ++i)
    if (i != share && !shares[i].absent) return true;
  return false;
}

// The job trains on without the share (elastic training across clusters excludes its ranks): its devices go back,
// and grow() starts it again once its cluster is up.
void Scheduler::shrink(JobRecord& job, size_t share, const std::string& why) {
  ClusterShare& s = job.placement->shares[share];
  executor_.stop_share(job.id, share);
  account(job, s);
  registry_.release({{s.cluster, s.ranks}});
  ++freed_;
  s.absent = true;
  // The standby on share 1's node holds the job's store from now on.
  if (share == 0 && !job.placement->rendezvous_moved) {
    job.placement->rendezvous_moved = true;
    job.placement->share0_stays_out = executor_.has_sites(job.id);
    executor_.store_moved(job, *job.placement);
  }
  job.updated_s = now();
  store_.update_job(job);
  store_.add_event(job.updated_s, job.id, "shrunk",
                   why + "; goes on as " + describe(*job.placement) + " without restarting" +
                       (share == 0 ? " (the standby on " + job.placement->shares[1].cluster + " holds its store" +
                                         (job.placement->share0_stays_out ? "; " + s.cluster +
                                              " does not come back: its site's outputs would lack the rows trained "
                                              "meanwhile" : "") + ")"
                                   : ""));
}

void Scheduler::grow() {
  for (int64_t id : std::vector<int64_t>(active_.begin(), active_.end())) {
    JobRecord& job = jobs_.at(id);
    if (job.state != JobState::Running || !job.placement) continue;
    for (size_t i = 0; i < job.placement->shares.size(); ++i) {
      ClusterShare& s = job.placement->shares[i];
      if (!s.absent || (i == 0 && job.placement->share0_stays_out)) continue;
      auto wait = grow_after_.find({id, i});
      if (wait != grow_after_.end() && now() < wait->second) continue;
      const std::string home = s.cluster;
      if (!registry_.up(registry_.index_of(home))) {
        const double since = down_since_.emplace(std::make_pair(id, i), now()).first->second;
        const bool moves = options_.move_after_s >= 0 && now() - since >= options_.move_after_s;
        s.cluster = moves ? other_home(job, i) : "";
      } else {
        down_since_.erase({id, i});  // up again: a later outage counts afresh
      }
      if (s.cluster.empty() || !registry_.reserve({{s.cluster, s.ranks}})) {  // nowhere up, or no room there yet
        s.cluster = home;
        continue;
      }
      s.absent = false;
      try {
        executor_.start_share(job, *job.placement, i);
      } catch (const std::exception& e) {
        const std::string tried = s.cluster;
        s.absent = true;
        registry_.release({{s.cluster, s.ranks}});
        s.cluster = home;
        grow_after_[{id, i}] = now() + 10;  // try again later, not on every pass
        StateStore::Transaction t(store_);
        store_.add_event(now(), id, "grow-failed", tried + ": " + e.what());
        t.commit();
        continue;
      }
      grow_after_.erase({id, i});
      down_since_.erase({id, i});
      job.updated_s = now();
      s.started_s = job.updated_s;
      StateStore::Transaction t(store_);
      store_.update_job(job);
      store_.add_event(job.updated_s, id, "grew",
                       s.cluster + ":" + std::to_string(s.ranks) + " joins the running job" +
                           (s.cluster != home ? " in place of " + home + " (down)" : "") + "; now " +
                           describe(*job.placement));
      t.commit();
    }
  }
}

std::string Scheduler::other_home(const JobRecord& job, size_t share) const {
  const PlacementRecord& p = *job.placement;
  if (share == 0 || (share == 1 && p.standby)) return "";
  const ClusterShare& s = p.shares[share];
  const ClusterInfo home = registry_.info(registry_.index_of(s.cluster));
  for (const ClusterInfo& c : registry_.clusters()) {
    const bool named = std::any_of(p.shares.begin(), p.shares.end(), [&](const ClusterShare& o) { return o.cluster == c.name; });
    // The same device and node size: the share runs as placed (its layout, its launchers' node count and sizes).
    const bool alike = c.device == home.device && c.devices_per_host == home.devices_per_host;
    if (c.up && alike && !named && c.free >= s.ranks) return c.name;
  }
  return "";
}

std::vector<StateStore::UsageRow> Scheduler::usage() const {
  std::map<std::pair<std::string, std::string>, double> by;
  for (const StateStore::UsageRow& r : store_.usage()) by[{r.user, r.cluster}] += r.device_s;
  for (int64_t id : active_) {
    const JobRecord& j = jobs_.at(id);
    if (j.state != JobState::Running || !j.placement) continue;
    for (const ClusterShare& s : j.placement->shares)
      if (!s.absent && s.started_s >= 0) by[{j.spec.user, s.cluster}] += s.ranks * std::max(0.0, now() - s.started_s);
  }
  std::vector<StateStore::UsageRow> out;
  for (const auto& [key, device_s] : by) out.push_back({key.first, key.second, device_s});
  return out;
}

int Scheduler::held_by(const std::string& user) const {
  int n = 0;
  for (int64_t id : active_) {
    const JobRecord& j = jobs_.at(id);
    if (j.spec.user == user && j.placement) n += j.placement->present_ranks();
  }
  return n;
}

// The lower-priority jobs to stop, fewest first from the lowest priority (the newest of a priority first), until
// the head's placement fits in what they free. Nothing is stopped unless it fits then.
bool Scheduler::preempt_for(const JobRecord& head) {
  std::vector<int64_t> lower;
  for (int64_t id : active_) {
    const JobRecord& j = jobs_.at(id);
    if (j.placement && holds_devices(j.state) && j.spec.priority < head.spec.priority) lower.push_back(id);
  }
  std::sort(lower.begin(), lower.end(), [&](int64_t a, int64_t b) {
    const JobRecord &x = jobs_.at(a), &y = jobs_.at(b);
    return x.spec.priority != y.spec.priority ? x.spec.priority < y.spec.priority : x.updated_s > y.updated_s;
  });
  Registry trial = registry_;
  std::vector<int64_t> victims;
  for (int64_t id : lower) {
    trial.release(shares_of(*jobs_.at(id).placement));
    victims.push_back(id);
    const Decision d = place(head.spec, progress_of(head, now()), trial, options_.placement, &cache_);
    if (d.verdict != Verdict::Placed) continue;
    const auto quota = options_.quotas.find(head.spec.user);
    if (quota != options_.quotas.end() && held_by(head.spec.user) + d.placement.present_ranks() > quota->second)
      return false;  // its own quota keeps it out, not the others
    for (int64_t v : victims) preempt(jobs_.at(v), head);
    return true;
  }
  return false;
}

// Checkpoint, then requeue: the executor's stop asks the ranks to stop (the trainer saves a checkpoint at the step
// they agree on), and the job waits again to resume from its newest checkpoint.
void Scheduler::preempt(JobRecord& victim, const JobRecord& head) {
  const ExecStatus before = executor_.status(victim.id);
  executor_.stop(victim.id);
  const ExecStatus after = executor_.status(victim.id);
  victim.step = std::max({victim.step, before.checkpoint_step, after.checkpoint_step});
  release(victim);
  victim.state = JobState::Queued;
  victim.reason = "preempted by job " + std::to_string(head.id) + " (priority " + std::to_string(head.spec.priority) +
                  " over " + std::to_string(victim.spec.priority) + "); resumes from step " + std::to_string(victim.step);
  victim.updated_s = now();
  StateStore::Transaction t(store_);
  store_.update_job(victim);
  store_.add_event(victim.updated_s, victim.id, "preempted", victim.reason);
  t.commit();
  queue_.push_back(victim.id);
}

int Scheduler::tick() {
  poll();
  grow();
  // Placed but not started: a restart came between the placement's commit and the start.
  for (int64_t id : std::vector<int64_t>(active_.begin(), active_.end()))
    if (jobs_.at(id).state == JobState::Placed) start(jobs_.at(id));
  int placed = 0;
  bool head_blocked = false;
  std::vector<int64_t> pass, waiting;
  pass.swap(queue_);  // a job whose start fails goes back to queue_, for the next pass
  // Higher priority first; within a priority, the queue's order (re-placed jobs at its front, then FIFO).
  std::stable_sort(pass.begin(), pass.end(),
                   [&](int64_t a, int64_t b) { return jobs_.at(a).spec.priority > jobs_.at(b).spec.priority; });
  for (size_t k = 0; k < pass.size(); ++k) {
    JobRecord& job = jobs_.at(pass[k]);
    if (progress_of(job, now()).seconds_left <= 0) {
      StateStore::Transaction t(store_);
      finish(job, JobState::Failed, "deadline passed while queued");
      t.commit();
      continue;
    }
    const bool may_try = !head_blocked || blocked_passes_ < options_.backfill_passes;
    if (may_try && try_place(job)) {
      start(job);
      ++placed;
      continue;
    }
    // Only a head that the clusters now up could hold holds back the jobs behind it; one that needs a lost
    // cluster waits without blocking.
    if (!head_blocked && fits_up_clusters(job)) {
      head_blocked = true;
      if (job.id != blocked_head_) blocked_head_ = job.id, blocked_passes_ = 0;  // a new head: backfill again
    }
    waiting.push_back(job.id);
  }
  // The first waiting job, if only lower-priority jobs keep it out, preempts them and starts now.
  if (options_.preemption && !waiting.empty() && fits_up_clusters(jobs_.at(waiting.front()))) {
    JobRecord& head = jobs_.at(waiting.front());
    if (preempt_for(head) && try_place(head)) {
      start(head);
      ++placed;
      waiting.erase(waiting.begin());
    }
  }
  waiting.insert(waiting.end(), queue_.begin(), queue_.end());
  queue_ = std::move(waiting);
  blocked_passes_ = head_blocked ? blocked_passes_ + 1 : 0;
  if (!head_blocked) blocked_head_ = 0;
  return placed;
}

int Scheduler::mark_lost(const std::string& cluster) {
  registry_.set_up(cluster, false);
  ++up_epoch_;
  const int index = registry_.index_of(cluster);
  std::vector<int64_t> displaced;
  StateStore::Transaction t(store_);
  store_.put_cluster({cluster, false, cluster_toml(registry_, index)});
  store_.add_event(now(), 0, "cluster-lost", cluster);
  for (int64_t id : std::vector<int64_t>(active_.begin(), active_.end())) {
    JobRecord& job = jobs_.at(id);
    if (!job.placement || !job.placement->on(cluster)) continue;
    bool shrunk = false;
    for (size_t i = 0; i < job.placement->shares.size(); ++i)
      if (job.placement->shares[i].cluster == cluster && job.state == JobState::Running && goes_on_without(job, i)) {
        shrink(job, i, "cluster " + cluster + " lost");
        shrunk = true;
      }
    if (shrunk && !job.placement->on(cluster)) continue;
    const ExecStatus s = executor_.status(id);
    executor_.stop(id);  // every share: a gang never runs in part
    job.step = std::max(job.step, s.checkpoint_step);
    release(job);
    job.state = JobState::Queued;
    job.reason = "cluster " + cluster + " lost; resumes from step " + std::to_string(job.step);
    job.updated_s = now();
    store_.update_job(job);
    store_.add_event(job.updated_s, id, "displaced", job.reason);
    displaced.push_back(id);
  }
  t.commit();
  queue_.insert(queue_.begin(), displaced.begin(), displaced.end());
  blocked_passes_ = 0;
  return static_cast<int>(displaced.size());
}

void Scheduler::mark_up(const std::string& cluster) {
  registry_.set_up(cluster, true);
  ++up_epoch_, ++freed_;
  StateStore::Transaction t(store_);
  store_.put_cluster({cluster, true, cluster_toml(registry_, registry_.index_of(cluster))});
  store_.add_event(now(), 0, "cluster-up", cluster);
  t.commit();
}

std::string Scheduler::register_cluster(const planner::ClusterFile& one) {
  if (one.clusters.size() != 1)
    throw UsageError("register a cluster with a cluster file holding exactly one cluster (it holds " +
                     std::to_string(one.clusters.size()) + ")");
  const planner::ClusterSpec& spec = one.clusters[0];
  int index = -1;
  for (int i = 0; i < registry_.size(); ++i)
    if (registry_.info(i).name == spec.name) index = i;
  if (index < 0) {
    registry_.add_cluster(spec, one.device_of(spec));
    ++up_epoch_, ++freed_;
    index = registry_.size() - 1;
    StateStore::Transaction t(store_);
    store_.put_cluster({spec.name, true, cluster_toml(registry_, index)});
    store_.add_event(now(), 0, "cluster-added", spec.name + ": " + std::to_string(registry_.devices(index)) + " x " + spec.device);
    t.commit();
    return "added";
  }
  Registry probe;
  probe.add_cluster(spec, one.device_of(spec));
  if (!same_cluster(probe.info(0), registry_.info(index)))
    throw UsageError("cluster '" + spec.name + "' is registered with another spec (devices, device type or links); "
                     "to change it, edit the daemon's cluster file and restart the daemon on a new state file");
  if (registry_.up(index)) return "unchanged";
  mark_up(spec.name);
  return "up";
}

void Scheduler::set_link(const std::string& a, const std::string& b, const comm::Link& link) {
  registry_.set_link(a, b, link);  // names both clusters, or throws naming the ones registered
  ++up_epoch_, ++freed_;           // placements may change: re-ask the queue
  cache_ = LayoutCache();
  StateStore::Transaction t(store_);
  store_.put_link({a, b, link.latency_s, link.bandwidth_Bps});
  store_.add_event(now(), 0, "link", a + " - " + b + ": " + std::to_string(link.bandwidth_Bps * 8 / 1e9) + " Gbit/s");
  t.commit();
}

bool Scheduler::cancel(int64_t id) {
  JobRecord& job = mutable_job(id);
  if (finished(job.state)) return false;
  if (job.state == JobState::Running) executor_.stop(id);
  queue_.erase(std::remove(queue_.begin(), queue_.end(), id), queue_.end());
  StateStore::Transaction t(store_);
  finish(job, JobState::Cancelled, "cancelled");
  t.commit();
  return true;
}

JobRecord& Scheduler::mutable_job(int64_t id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) throw UsageError("no job " + std::to_string(id) + " (crosstrain job status lists them)");
  return it->second;
}

std::vector<int64_t> Scheduler::running() const {
  std::vector<int64_t> ids;
  for (int64_t id : active_)
    if (jobs_.at(id).state == JobState::Running) ids.push_back(id);
  return ids;
}

const JobRecord& Scheduler::job(int64_t id) const { return const_cast<Scheduler*>(this)->mutable_job(id); }

std::vector<const JobRecord*> Scheduler::jobs() const {
  std::vector<const JobRecord*> out;
  for (const auto& [id, j] : jobs_) out.push_back(&j);
  return out;
}

}  // namespace crosstrain::scheduler
