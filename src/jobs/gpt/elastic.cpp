#include "crosstrain/jobs/gpt/elastic.h"

#include <signal.h>
#include <unistd.h>

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <deque>
#include <numeric>
#include <set>

#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/core/allocator.h"
#include "crosstrain/core/threads.h"
#include "crosstrain/elastic/membership.h"
#include "crosstrain/models/parallelize.h"
#include "crosstrain/obs/footprint.h"
#include "crosstrain/obs/metrics_server.h"
#include "crosstrain/obs/step_log.h"
#include "crosstrain/train/loop.h"
#include "crosstrain/sync/strategy.h"
#include "crosstrain/train/sync_mode.h"
#include "crosstrain/train/debug_fault.h"
#include "../dlrm/job.h"  // the other family an elastic generation runs
#include "run.h"

namespace crosstrain::train {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double seconds_between(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Where a generation's set-up went, for the log line that starts it (the survivors wait this long).
std::string setup_times(Clock::time_point group, Clock::time_point run, Clock::time_point state, Clock::time_point start) {
  char text[160];
  std::snprintf(text, sizeof text, " (set up in %.2f s: group %.2f s, run %.2f s, state %.2f s)",
                seconds_since(group), seconds_between(group, run), seconds_between(run, state),
                seconds_between(state, start));
  return text;
}


// The first process of a rank only: a restarted one must not fail again at the same step.
// How often the launcher restarted this rank's process (0: the first one).
int64_t restart_count() {
  const char* restarts = std::getenv("CROSSTRAIN_RESTART_COUNT");
  if (!restarts) return 0;
  try {
    return std::stoll(restarts);
  } catch (const std::exception&) {
    return 0;
  }
}

bool is_dlrm(const Config& c) { return c.model.arch == models::ModelArch::Dlrm; }

int job_dp(const Config& c, int world) {
  return is_dlrm(c) ? world : models::gpt_dims(c.model, c.parallel, c.train.micro_batches, world).dp();
}

// The units that leave and join, in data-parallel ranks each, in rank order: one replica; with DiLoCo a whole
// cluster (sync.clusters equal blocks, or sync.cluster_ranks of any sizes); with ZeRO the dp_shard ranks that
// shard one copy of the state (HSDP); DLRM, whose tables are sharded over every rank, the whole job.
// check_elastic_config refuses the layouts where none of these is whole.
std::vector<int> replica_widths(const Config& c, int dp) {
  if (is_dlrm(c)) return {dp};
  if (c.sync.mode == SyncMode::DiLoCo && !c.sync.cluster_ranks.empty()) {
    std::vector<int> widths;
    for (int64_t n : parse_cluster_ranks(c.sync.cluster_ranks)) widths.push_back(static_cast<int>(n));
    return widths;
  }
  int width = c.parallel.zero > 0 ? static_cast<int>(c.parallel.dp_shard) : 1;
  if (c.sync.mode == SyncMode::DiLoCo) width = dp / static_cast<int>(std::max<int64_t>(1, c.sync.clusters));
  return std::vector<int>(static_cast<size_t>(dp / std::max(1, width)), width);
}

int job_replicas(const Config& c, int world) {
  return static_cast<int>(replica_widths(c, job_dp(c, world)).size());
}

int sum_of(const std::vector<int>& v) { return std::accumulate(v.begin(), v.end(), 0); }

// The config of a generation of the `live` replicas (their slots, ascending) of a job whose replicas are `widths`
// data-parallel ranks wide: the per-rank batch stays.
Config generation_config(const Config& c, const std::vector<int>& live, const std::vector<int>& widths) {
  Config g = c;
  std::vector<int> live_widths;
  for (int slot : live) live_widths.push_back(widths.at(static_cast<size_t>(slot)));
  g.parallel.dp = sum_of(live_widths);
  if (c.sync.mode == SyncMode::DiLoCo) {
    g.sync.clusters = static_cast<int64_t>(live.size());
    if (!c.sync.cluster_ranks.empty()) {
      g.sync.cluster_ranks.clear();
      for (int w : live_widths) g.sync.cluster_ranks += (g.sync.cluster_ranks.empty() ? "" : ",") + std::to_string(w);
    }
  }
  g.train.global_batch = c.train.global_batch / sum_of(widths) * g.parallel.dp;
  return g;
}

// How each step's vote is cast (elastic.overlap_votes). In sync mode a replica of one rank that voted a step
// holds its fully reduced gradients and applies them: the step stands even if it aborts, and survivors that did
// not get there heal from it (see settle_posted_vote), so no copy is needed. Elsewhere a step may be applied on
// some of a replica's ranks only (or, in DiLoCo, by some clusters only: the others would lose their inner steps to
// a heal), so an overlapped vote keeps a copy to go back to, and "auto" votes in line.
enum class Overlap { Never, WithoutACopy, KeepingACopy };

Overlap vote_overlap(const Config& c, int world, int replicas) {
  if (c.elastic.overlap_votes == "never") return Overlap::Never;
  const bool stands = c.sync.mode == SyncMode::Sync && !is_dlrm(c) && world == replicas;
  if (stands) return Overlap::WithoutACopy;
  return c.elastic.overlap_votes == "always" ? Overlap::KeepingACopy : Overlap::Never;
}

// The loop's own stop vote is off: a request to stop rides on the membership's step vote instead.
TrainOptions without_stop_vote(TrainOptions o) {
  o.stop_requested = nullptr;
  return o;
}

TrainOptions without_resume(TrainOptions o) {
  o.resume = false;
  return o;
}

// One process's part in an elastic job: a Job per generation (a Run, or a DlrmJob); the state carried from one to
// the next.
class ElasticLoop {
 public:
  ElasticLoop(const Config& c, elastic::Membership& m, const TrainOptions& o, GemmPeak peak)
      : c_(c), m_(m), o_(o), peak_(std::move(peak)), slots_(job_replicas(c, m.world_size())),
        widths_(replica_widths(c, job_dp(c, m.world_size()))),
        kill_(parse_debug_fault(c.debug.elastic_kill, "elastic_kill")),
        stop_(parse_debug_fault(c.debug.elastic_stop, "elastic_stop")),
        kill_at_vote_(parse_debug_fault(c.debug.elastic_kill_at_vote, "elastic_kill_at_vote")),
        kill_at_outputs_(parse_debug_fault(c.debug.elastic_kill_at_outputs, "elastic_kill_at_outputs")),
        kill_in_heal_(parse_debug_fault(c.debug.elastic_kill_heal, "elastic_kill_heal")),
        overlap_(vote_overlap(c, m.world_size(), slots_)), dlrm_options_(without_resume(o)),
        loop_options_(without_stop_vote(o)), loop_(c, loop_options_) {}
  ~ElasticLoop();
  TrainResult run();

 private:
  bool run_generation();
  std::unique_ptr<Job> make_job(const Config& c, comm::Communicator& world, const RunStart& start) const;
  void bootstrap_state();
  bool train_steps();
  void recover(const CommError& error, int64_t successor);
  std::string how_it_ended(const CommError& error) const;
  void recover_or_fail_over(const CommError& error, int64_t successor);
  void accuse_if_evidence(const CommError& error);
  void fail_over(const CommError& error);
  void finish();
  void note(const std::string& line) const;
  // The replica (its slot in the full job) of data-parallel rank `dp` of this generation.
  int replica_at(int dp) const {
    for (int slot : gen_.replicas) {
      dp -= widths_.at(static_cast<size_t>(slot));
      if (dp < 0) return slot;
    }
    return -1;
  }
  void fault_if_asked(int64_t step);
  void keep_state_before(int64_t step);
  void redo_missed_outputs(int64_t first);
  elastic::Decision settle_posted_vote();
  void cast_vote(int64_t step, elastic::Decision& d);

  const Config& c_;
  elastic::Membership& m_;
  const TrainOptions& o_;
  const GemmPeak peak_;  // this process's own, measured before it registered
  const int slots_;
  const std::vector<int> widths_;  // data-parallel ranks of each replica of the full job
  const DebugFault kill_, stop_, kill_at_vote_, kill_at_outputs_, kill_in_heal_;
  const int64_t restarts_ = restart_count();  // read once, not on every step
  const bool first_incarnation_ = restarts_ == 0;
  elastic::Generation gen_;
  // A generation's objects. Gloo cannot cancel an operation in flight: when a failure ends a generation, the
  // operations it abandoned keep its communicator and buffers in use until the group's timeout ends them. So a
  // generation's objects retire when it ends and are destroyed once that timeout has passed: over many failures
  // at most a timeout's worth of generations is held (before, every one stayed until the process ended).
  struct Objects {
    std::unique_ptr<Config> config;
    std::unique_ptr<comm::Communicator> world;
    std::unique_ptr<Job> run;
    Clock::time_point retired{};
  };
  void retire_generation();
  void destroy_retired();
  Objects current_;
  std::deque<Objects> retired_;
  Job* run_ = nullptr;
  comm::Communicator* world_ = nullptr;
  obs::ProcessFootprint footprint_at_start_;  // at the first generation (printed at the end beside the last)
  bool footprint_taken_ = false;
  LiveState carried_;
  bool has_state_ = false;     // this generation's Run holds the live state (loaded, adopted or healed)
  bool started_ = false;       // this generation's start step is agreed
  int64_t trained_in_ = 0;     // the newest generation this rank started (0: none), and its members
  int trained_members_ = 0;
  const char* setup_phase_ = "group";  // where its set-up is (a log line says where a failure ended it)
  Clock::time_point setup_began_{};
  bool decided_ = false;       // the fate of the step in flight is known on this rank
  Clock::time_point step_began_{};  // of the step in flight (its abort line says how far into it the rank was)
  int64_t next_step_ = 1;
  // elastic.overlap_votes: the step whose vote is cast but whose fate this rank has not read yet (0: none), and
  // this rank's state from before that step's update, to carry instead of the live one if the step aborts.
  int64_t posted_step_ = 0;
  int64_t unread_step_ = 0;  // a posted step whose fate the store did not give (it failed while asked)
  LiveState before_posted_;
  bool roll_back_ = false;  // the posted step aborted: the next generation starts from before_posted_
  int64_t kept_step_ = 0;   // the posted step aborted but stands on this rank (a replica of one rank applied it)
  bool trained_ = false;    // this process committed a step in some generation
  std::optional<StepRecord> interrupted_;  // the record of a voted step whose own exchange failed (voted_record)
  const Overlap overlap_;
  int64_t overlapped_votes_ = 0;
  int64_t first_step_ = 1;  // the generation's
  int64_t switch_to_ = 0;
  bool stopped_ = false;  // a committed step was voted the last (a rank was asked to stop)
  bool header_printed_ = false;
  double vote_s_ = 0;  // time in the per-step vote (the cost of membership on the critical path)
  int64_t votes_ = 0;
  // The loop's options: elastic steps end by votes of the membership, not by the loop's stop vote (a stop would
  // read as a new generation).
  const TrainOptions dlrm_options_;  // a DLRM generation's: the loop decides when to load the checkpoint
  const TrainOptions loop_options_;
  TrainLoop loop_;  // the run's outputs (while this process is rank 0) and its steps
};

ElasticLoop::~ElasticLoop() {
  // The process is ending: what may still be in use (the last generation, the retired ones not yet due) is left
  // to the exit rather than waited for.
  retire_generation();
  for (Objects& o : retired_) {
    (void)o.run.release();
    (void)o.world.release();
    (void)o.config.release();
  }
}

void ElasticLoop::retire_generation() {
  if (!current_.config && !current_.world && !current_.run) return;
  // A step that committed but failed in its own exchange: its row is written by the next generation.
  if (run_)
    if (std::optional<StepRecord> voted = run_->voted_record()) interrupted_ = voted;
  current_.retired = Clock::now();
  retired_.push_back(std::move(current_));
  current_ = Objects{};
  run_ = nullptr;
  world_ = nullptr;
}

// Destroys the retired generations whose abandoned operations have certainly ended (the group's timeout and a
// second more): the Run first (it refers to the communicator), then the communicator, then the config.
void ElasticLoop::destroy_retired() {
  const auto due = m_.group_timeout() + std::chrono::seconds(1);
  bool released = false;
  while (!retired_.empty() && Clock::now() - retired_.front().retired >= due) {
    Objects o = std::move(retired_.front());
    retired_.pop_front();
    o.run.reset();
    o.world.reset();
    o.config.reset();
    released = true;
  }
  // The allocator keeps freed memory for reuse (keep_freed_memory_for_reuse): a generation's worth, once it is gone,
  // goes back to the system, so the resident size stays where it was after any number of failures.
  if (released) return_freed_memory();
}

void ElasticLoop::note(const std::string& line) const {
  if (o_.quiet) return;
  std::fprintf(stderr, "crosstrain elastic: [%s] rank %d: %s\n", elastic::log_time(elastic::unix_ms()).c_str(), m_.rank(),
               line.c_str());
}

void ElasticLoop::fault_if_asked(int64_t step) {
  if (!first_incarnation_) return;
  const bool kill = kill_.hits(m_.rank(), step), stop = stop_.hits(m_.rank(), step);
  if (!kill && !stop) return;
  // The step before is voted (an overlapped vote may still be on its way to the store): the fault lands in this
  // step whatever the voter thread's timing, as a test expects.
  if (posted_step_ > 0) (void)settle_posted_vote();
  raise(kill ? SIGKILL : SIGSTOP);
}

TrainResult ElasticLoop::run() {
  gen_ = m_.await_member_generation(0);
  for (;;) {
    try {
      if (run_generation()) break;
      carried_ = run_->live_state(next_step_);  // a committed step named the next generation
      // That one, unless a failure closed it meanwhile (then the failure's generation, as for everyone else).
      gen_ = m_.await_member_generation(switch_to_ - 1);
    } catch (const elastic::GenerationEnded& e) {
      recover_or_fail_over(e, e.successor());
    } catch (const CommError& e) {
      accuse_if_evidence(e);
      recover_or_fail_over(e, 0);
    }
  }
  if (stopped_) {
    m_.finish();
    loop_.finish_stopped(*run_, world_->rank() == 0);
  } else {
    finish();
  }
  destroy_retired();
  if (!o_.quiet && footprint_taken_)
    note("process: " + obs::describe(obs::process_footprint()) + " after " + std::to_string(gen_.id) +
         " generations, " + std::to_string(retired_.size()) + " of them retired and not yet released (at its first: " +
         obs::describe(footprint_at_start_) + ")");
  return loop_.result();
}

// A message that did not authenticate is the sender's failure, not this rank's (comm.encrypt): the coordinator
// excludes the sender (its launcher ends it, a restart rejoins with fresh keys) and this rank goes on.
void ElasticLoop::accuse_if_evidence(const CommError& error) {
  const int member = error.context().accused;
  if (member < 0) return;
  try {
    if (m_.accuse(gen_, member, error.cause()))
      note("generation " + std::to_string(gen_.id) + ": rank " + std::to_string(gen_.ranks.at(member)) +
           " sent a message that did not authenticate; asked the coordinator to exclude it");
  } catch (const std::exception& e) {
    note(std::string("could not report the rank whose message did not authenticate: ") + e.what());
  }
}

// What ended the step in flight and when, for its abort line: a wait that a failure generation cut short ends at
// once, one that it could not reach ends at its own timeout (the line says which, and how long the step took).
std::string ElasticLoop::how_it_ended(const CommError& error) const {
  char when[64];
  std::snprintf(when, sizeof when, "; %.2f s into the step: ", seconds_since(step_began_));
  std::string what = error.what();
  if (what.size() > 240) what = what.substr(0, 240) + "...";
  return when + what;
}

// After a failure: learns the fate of the step in flight (it never commits here: this rank did not vote), keeps
// the committed state, and moves to the newest generation that counts this process.
void ElasticLoop::recover(const CommError& error, int64_t successor) {
  if (started_ && posted_step_ > 0) {
    // The fate of the step voted last (its update may be applied already): kept if it committed, else undone or,
    // for a replica of one rank, kept as well (settle_posted_vote says why).
    elastic::Decision d;
    try {
      d = settle_posted_vote();
    } catch (const CommError&) {
      throw error;
    }
    if (!d.commit) {
      successor = d.next_generation;
      decided_ = true;  // nobody voted for the step after it: nothing else to learn
    }
  }
  if (started_ && !decided_) {
    elastic::Decision d;
    try {
      d = m_.await_decision(gen_, next_step_);
    } catch (const CommError&) {
      throw error;  // no member failed: the original error stands
    }
    if (d.commit) throw Error("elastic: step " + std::to_string(next_step_) + " committed without this rank's vote (a bug)");
    successor = d.next_generation;
  }
  if (kept_step_ > 0) {
    note("step " + std::to_string(kept_step_) + " aborted in generation " + std::to_string(gen_.id) +
         " after this rank applied it: it stands (its gradients were fully reduced), the step in flight is redone");
  } else if (started_ && next_step_ > c_.train.steps) {
    note("generation " + std::to_string(gen_.id) + " ended during the outputs of the last step, " +
         std::to_string(c_.train.steps) + " (committed)");
  } else if (started_) {
    note("step " + std::to_string(next_step_) + " aborted in generation " + std::to_string(gen_.id) +
         (roll_back_ ? ": this rank had applied it and goes back to its state from before the step" : "") +
         how_it_ended(error));
  } else {
    char when[80];
    std::snprintf(when, sizeof when, " (in its %s set-up, after %.2f s): ", setup_phase_, seconds_since(setup_began_));
    note("generation " + std::to_string(gen_.id) + " ended before it started" + when + error.what());
  }
  if (roll_back_) {
    carried_ = before_posted_;
  } else if (has_state_ && run_) {
    carried_ = run_->live_state(next_step_);
  }
  // Its Run is kept until the abandoned operations have ended (retire_generation), so its trace is written now.
  if (run_) run_->flush_trace();
  retire_generation();
  gen_ = m_.await_member_generation(std::max(gen_.id, successor - 1));
}

// recover(), unless the job's store is gone: then the standby's (crosstrain run --standby), if there is one.
void ElasticLoop::recover_or_fail_over(const CommError& error, int64_t successor) {
  try {
    recover(error, successor);
  } catch (const CommError& e) {
    if (!m_.primary_lost()) throw;
    fail_over(e);
  }
}

// Node 0, with the job's store and coordinator, is gone. What this rank knows stands: a step it read as committed
// is kept, and one whose fate it never read is treated as aborted (a member that read its commit carries the newer
// state, which the next generation's newest-wins bootstrap gives to everyone). The standby's coordinator starts a
// generation of the ranks that came over, numbered above every old one.
void ElasticLoop::fail_over(const CommError& error) {
  if (posted_step_ > 0 || unread_step_ > 0) {
    const int64_t step = std::max(posted_step_, unread_step_);
    posted_step_ = unread_step_ = 0;
    if (overlap_ == Overlap::KeepingACopy) {
      roll_back_ = true;
      next_step_ = step;
    } else {
      kept_step_ = step;
    }
  }
  if (run_) {
    if (roll_back_) carried_ = before_posted_;
    else if (has_state_) carried_ = run_->live_state(next_step_);
    run_->flush_trace();
  }
  retire_generation();
  note("lost the job's store at " + m_.store_address() + " (" + error.what() + "); going over to the standby at " +
       m_.standby_address() + " with the state before step " +
       std::to_string(carried_.valid() ? carried_.next_step : next_step_));
  m_.fail_over(gen_.id, trained_in_, trained_members_);
  gen_ = m_.await_member_generation(gen_.id);
}

std::unique_ptr<Job> ElasticLoop::make_job(const Config& c, comm::Communicator& world, const RunStart& start) const {
  // DLRM's tables are sharded over every rank: one replica, nothing to heal; the loop loads the checkpoint itself.
  if (c.model.arch == models::ModelArch::Dlrm) return std::make_unique<DlrmJob>(c, world, dlrm_options_);
  // Each generation has its own world size: its layout is resolved here, once per generation.
  return std::make_unique<Run>(c, validate(c, world.size()), world, o_, start);
}

bool ElasticLoop::run_generation() {
  has_state_ = started_ = decided_ = roll_back_ = false;
  posted_step_ = kept_step_ = unread_step_ = 0;
  before_posted_ = LiveState{};  // its tensors may be carried_ now, which keeps them
  const auto t_group = Clock::now();
  setup_began_ = t_group;
  setup_phase_ = "group";
  retire_generation();
  destroy_retired();
  current_.config =
      std::make_unique<Config>(generation_config(c_, gen_.replicas, widths_));
  current_.world = m_.build_world(gen_);
  world_ = current_.world.get();
  const auto t_run = Clock::now();
  setup_phase_ = "run";
  if (world_->rank() != 0) loop_.close_outputs();  // a rank 0 of an earlier generation serves no stale figures
  RunStart start;
  start.refuse_old_run_dir = false;
  start.slot = m_.replica();
  start.first_slot = std::accumulate(widths_.begin(), widths_.begin() + m_.replica(), 0);
  start.slots = sum_of(widths_);
  start.replica_width = widths_.at(static_cast<size_t>(m_.replica()));
  start.peak = peak_;
  current_.run = make_job(*current_.config, *world_, start);
  run_ = current_.run.get();
  if (!footprint_taken_) {
    footprint_at_start_ = obs::process_footprint();
    footprint_taken_ = true;
  }
  const auto t_state = Clock::now();
  setup_phase_ = "state";
  bootstrap_state();
  const auto t_start = Clock::now();
  setup_phase_ = "start";
  started_ = m_.start(gen_, next_step_);
  if (!started_) throw elastic::GenerationEnded(CommContext{}, m_.latest_generation());
  // What a standby's quorum counts this rank for, should the job's store be lost (membership_logic.h, Takeover).
  trained_in_ = gen_.id;
  trained_members_ = static_cast<int>(gen_.ranks.size());
  if (world_->rank() == 0) {
    note("generation " + std::to_string(gen_.id) + " (" + gen_.reason + "): " + std::to_string(gen_.replicas.size()) +
         " of " + std::to_string(slots_) + " replicas train from step " + std::to_string(next_step_) +
         setup_times(t_group, t_run, t_state, t_start));
    if (!header_printed_) run_->print_header();
    header_printed_ = true;
    // A new rank 0 may find the metrics port still held by the last one's process: an elastic job goes on
    // without the endpoint rather than fail (and be restarted, and fail again) over a monitor.
    // Rows from the generation's first step on are replaced (the last step's own, when it redoes its outputs).
    loop_.open_outputs(std::min(next_step_, std::max<int64_t>(1, c_.train.steps)), /*tolerate_busy_port=*/true);
  }
  return train_steps();
}

// Who holds what: live state carried from the last generation (the newest step wins), else the newest checkpoint,
// else the seed. Replicas behind the best one receive its state over the data-parallel group.
void ElasticLoop::bootstrap_state() {
  at::Tensor mine = at::tensor({carried_.valid() ? int64_t{1} : int64_t{0}, carried_.next_step,
                                static_cast<int64_t>(run_->dp_index())}, at::kLong);
  at::Tensor all = at::empty({world_->size() * 3}, at::kLong);
  world_->all_gather(mine, all)->wait();
  const at::Tensor rows = all.view({-1, 3});
  auto a = rows.accessor<int64_t, 2>();
  int64_t best = -1, donor = -1;
  for (int r = 0; r < world_->size(); ++r)
    if (a[r][0] && (a[r][1] > best || (a[r][1] == best && a[r][2] < donor))) best = a[r][1], donor = a[r][2];
  std::set<int> behind;  // data-parallel indices of replicas without the newest state
  for (int r = 0; r < world_->size(); ++r)
    if (!a[r][0] || a[r][1] != best) behind.insert(static_cast<int>(a[r][2]));
  if (best < 0) {
    // No live state anywhere: the whole job (re)started.
    if (checkpoint::latest_checkpoint(c_.run.dir)) {
      run_->load_latest_checkpoint();
      if (world_->rank() == 0) note("no live replica holds the state: resumed from the newest checkpoint");
    }
    next_step_ = run_->start_step();
  } else {
    if (carried_.valid()) run_->adopt(carried_);
    next_step_ = best;
    const std::vector<int> receivers(behind.begin(), behind.end());
    auto die_if_asked = [this] {
      const int64_t n = kill_in_heal_.step_for(m_.rank());
      if (restarts_ >= 1 && restarts_ <= n) raise(SIGKILL);
    };
    const HealStats h = run_->heal_from(static_cast<int>(donor), receivers, next_step_, die_if_asked);
    run_->state_in_place(next_step_, behind.count(run_->dp_index()) > 0);
    if (behind.count(run_->dp_index()) && h.bytes > 0) {
      char line[200];
      std::snprintf(line, sizeof line, "healed from replica %lld: %lld bytes in %.4f s (heal_MBps=%.1f)",
                    static_cast<long long>(replica_at(static_cast<int>(donor))), static_cast<long long>(h.bytes), h.seconds,
                    h.bytes / std::max(h.seconds, 1e-9) / 1e6);
      note(line);
    }
  }
  has_state_ = true;
  if (c_.debug.elastic_digest && !o_.quiet) {
    const std::string outer = run_->sync_state_digest();
    std::fprintf(stderr, "crosstrain elastic: rank %d generation %lld state digest %s at step %lld%s%s\n", m_.rank(),
                 static_cast<long long>(gen_.id), run_->state_digest().c_str(), static_cast<long long>(next_step_),
                 outer.empty() ? "" : "; outer state digest ", outer.c_str());
  }
}

// The generation's steps through the one loop: an injected fault before a step, the step's vote before its
// update, and a new generation named by a committed step ends this one.
bool ElasticLoop::train_steps() {
  const int64_t first = next_step_;
  first_step_ = first;
  if (first > 1) redo_missed_outputs(first);
  elastic::Decision d;
  StepHooks hooks;
  hooks.before_step = [&](int64_t step) {
    fault_if_asked(step);
    decided_ = false;
    step_began_ = Clock::now();
  };
  hooks.before_commit = [&](int64_t step) {
    const auto vote_start = Clock::now();
    cast_vote(step, d);
    vote_s_ += seconds_since(vote_start);
    ++votes_;
  };
  hooks.committed = [&](int64_t step) {
    if (first_incarnation_ && kill_at_outputs_.hits(m_.rank(), step)) raise(SIGKILL);
    next_step_ = step + 1;
    trained_ = true;
    destroy_retired();
    if (world_->rank() == 0 && step == first)
      note("generation " + std::to_string(gen_.id) + ": step " + std::to_string(step) + " committed");
  };
  hooks.keep_going = [&](int64_t step) {
    if (d.stop && step < c_.train.steps) {  // a stop voted at the last step: the run simply ends
      stopped_ = true;
      loop_.result().stopped_after = step;
      return false;
    }
    // A join named at the last step is not switched to: the run is over (a generation past the last step would
    // only do that step's outputs again), and the joiners learn that the job finished.
    if (d.next_generation <= gen_.id || step >= c_.train.steps) return true;
    // A join (a failure aborts instead) waits for the next outer step where asked: every member reads the same
    // decisions and takes the same outer steps, so all switch after the same step.
    if (c_.elastic.join_at_outer_steps && !run_->at_sync_boundary()) return true;
    switch_to_ = d.next_generation;
    return false;
  };
  return loop_.run(*run_, *world_, first, hooks) == LoopEnd::Finished || stopped_;
}

// A step's vote, once its gradients are reduced. In line: the rank waits for the step's fate before its update.
// Overlapped (elastic.overlap_votes): it reads the fate of the step before, keeps its state, casts this step's
// vote on the voter's thread and goes on with the update; the next step's vote (or a failure) reads the fate.
// Every member makes the same choice: it depends on the step, the config and decisions every member reads alike.
void ElasticLoop::cast_vote(int64_t step, elastic::Decision& d) {
  if (first_incarnation_ && kill_at_vote_.hits(m_.rank(), step)) raise(SIGKILL);
  bool news = false;  // the step before named a generation to switch to, or a stop: this one ends in line
  if (posted_step_ > 0) {
    const elastic::Decision before = settle_posted_vote();
    if (!before.commit) {
      decided_ = true;  // this step was not voted; it and the one before are redone
      throw elastic::GenerationEnded(CommContext{}, before.next_generation);
    }
    news = before.stop || before.next_generation > gen_.id;
  }
  const bool stop = o_.stop_requested && o_.stop_requested();
  decided_ = true;
  // A generation's first step is voted in line too: its log line says it committed.
  const bool in_line = news || step == first_step_ || loop_.step_has_outputs(*run_, step);
  if (overlap_ != Overlap::Never && !in_line) {
    if (overlap_ == Overlap::KeepingACopy) keep_state_before(step);
    m_.post_vote(gen_, step, stop);
    posted_step_ = step;
    ++overlapped_votes_;
    d = elastic::Decision{};
    d.commit = true;  // as far as this rank knows: the loop goes on to the next step
  } else {
    d = m_.vote(gen_, step, stop);
    if (!d.commit) throw elastic::GenerationEnded(CommContext{}, d.next_generation);
  }
  // Committed, or voted and applied: the update that follows is local (whatever communication comes after it,
  // such as DiLoCo's outer exchange, may fail), so from here on the state is that after this step.
  next_step_ = step + 1;
}

// Reads the fate of the step voted last.
elastic::Decision ElasticLoop::settle_posted_vote() {
  const int64_t step = posted_step_;
  posted_step_ = 0;
  unread_step_ = step;  // until the store answers: fail_over decides what the step is worth if it never does
  const elastic::Decision d = m_.posted_decision();
  unread_step_ = 0;
  // A replica of one rank that voted has the step's fully reduced gradients and applied them: the step stands
  // (the generation that follows starts from the newest state, and survivors that did not get there heal from
  // it). A replica of several ranks may have applied it on some of its ranks only: every rank goes back.
  if (!d.commit && overlap_ == Overlap::KeepingACopy) {
    roll_back_ = true;
    next_step_ = step;
  } else if (!d.commit) {
    kept_step_ = step;
  }
  return d;
}

// A copy of this rank's live state before `step`'s update, into buffers kept from step to step.
void ElasticLoop::keep_state_before(int64_t step) {
  const LiveState live = run_->live_state(step);
  std::vector<at::Tensor>& kept = before_posted_.tensors;
  bool reuse = kept.size() == live.tensors.size();
  for (size_t i = 0; reuse && i < kept.size(); ++i)
    reuse = kept[i].sizes() == live.tensors[i].sizes() && kept[i].dtype() == live.tensors[i].dtype();
  at::NoGradGuard no_grad;
  if (reuse) {
    for (size_t i = 0; i < kept.size(); ++i) kept[i].copy_(live.tensors[i]);
  } else {
    kept.clear();
    for (const at::Tensor& t : live.tensors) kept.push_back(t.detach().clone());
  }
  before_posted_.optimizer_steps = live.optimizer_steps;
  before_posted_.next_step = step;
}

// The step before this generation's first committed in an earlier generation, and a failure may have ended that
// generation before the step's outputs were done: during them (its evaluation or checkpoint are collectives with
// the member that failed), or before them, in the step's own exchange after its update (DiLoCo's outer step). Rank
// 0's metrics.jsonl says which (it was reopened from this generation's first step, or from the last step when the
// job is past it). A missing row has its outputs done again: evaluation, checkpoint (replacing one already
// written) and row, with the step's record from the first member that kept one.
void ElasticLoop::redo_missed_outputs(int64_t first) {
  const int64_t step = std::min(first - 1, c_.train.steps);
  const auto& done = loop_.result().steps;
  std::optional<StepRecord> own;
  if (!done.empty() && done.back().step == step) own = done.back();
  else if (interrupted_ && interrupted_->step == step) own = interrupted_;
  const bool missing = world_->rank() == 0 && step >= 1 && loop_.metrics_last_kept_step() < step;
  const StepRecord r = own.value_or(StepRecord{});
  const std::vector<double> fields = {trained_ ? 1.0 : 0.0, missing ? 1.0 : 0.0, own ? 1.0 : 0.0, r.loss, r.lr,
                                      r.grad_norm, r.step_time_s, r.tokens_per_s, r.comm_time_s, r.exposed_comm_time_s,
                                      static_cast<double>(r.local_batch)};
  const int64_t n = static_cast<int64_t>(fields.size());
  at::Tensor all = at::empty({world_->size() * n}, at::kDouble);
  at::Tensor local = at::tensor(fields, at::kDouble);
  world_->all_gather(local, all)->wait();
  auto a = all.accessor<double, 1>();
  bool trained_before = false;
  for (int q = 0; q < world_->size(); ++q) trained_before |= a[q * n] != 0;
  // A job's first generation (a fresh start or a resume from a checkpoint) has nothing of its own to redo.
  if (!trained_before || a[1] == 0) return;
  StepRecord rec;
  rec.step = step;
  rec.loss = std::nan("");  // no member kept it: the row reads null
  for (int q = 0; q < world_->size(); ++q) {
    if (a[q * n + 2] == 0) continue;
    rec.loss = a[q * n + 3], rec.lr = a[q * n + 4], rec.grad_norm = a[q * n + 5], rec.step_time_s = a[q * n + 6];
    rec.tokens_per_s = a[q * n + 7], rec.comm_time_s = a[q * n + 8], rec.exposed_comm_time_s = a[q * n + 9];
    rec.local_batch = static_cast<int64_t>(a[q * n + 10]);
    break;
  }
  if (world_->rank() == 0)
    note("step " + std::to_string(step) + " committed in an earlier generation, which ended before its outputs "
         "were done: its outputs now");
  loop_.redo_outputs(*run_, rec, world_->rank() == 0);
}

void ElasticLoop::finish() {
  m_.finish();
  const bool leader = world_->rank() == 0;
  loop_.finish(*run_, leader);
  if (leader && !o_.quiet && votes_ > 0) {
    char line[160];
    std::snprintf(line, sizeof line, "membership: %lld step votes (%lld overlapped with the next step), %.3f ms each "
                  "on the critical path on average", static_cast<long long>(votes_),
                  static_cast<long long>(overlapped_votes_), 1000 * vote_s_ / static_cast<double>(votes_));
    note(line);
  }

}

}  // namespace

void check_elastic_config(const Config& c, int world) {
  if (!sync_traits(c.sync).elastic)
    throw UsageError("elastic training does not run hierarchical sync (sync.hierarchical = true: its clusters must "
                     "stay balanced as replicas come and go): use sync.mode = \"diloco\" with sync.clusters, whose "
                     "unit of churn is a whole cluster, or plain sync");
  if (c.comm.backend != "gloo")
    throw UsageError("elastic training rebuilds its groups without the lost ranks, which needs comm.backend = "
                     "\"gloo\" (MPI cannot shrink a communicator without the ULFM extension, which Debian's Open MPI "
                     "lacks); got \"" + c.comm.backend + "\"");
  const bool diloco = c.sync.mode == SyncMode::DiLoCo;
  if (diloco && c.sync.clusters < 1 && c.sync.cluster_ranks.empty())
    throw UsageError("elastic DiLoCo takes a whole cluster out and back in, and finds its clusters from "
                     "sync.clusters (consecutive blocks of data-parallel ranks) or sync.cluster_ranks (blocks of the "
                     "sizes given) for now: set one of them");
  if (diloco && c.sync.fragments > 1 && c.sync.overlap_steps > 0)
    throw UsageError("elastic streaming DiLoCo needs sync.overlap_steps = 0 for now: an exchange in flight across "
                     "steps would be lost with the generation that started it");
  // A generation with fewer clusters than sync.cluster_batch names would be refused by its Run after a failure,
  // and every restart would fail the same way: refused here, before anything trains.
  if (diloco && !c.sync.cluster_batch.empty())
    throw UsageError("elastic DiLoCo gives every live cluster the same share of the batch: leave sync.cluster_batch "
                     "empty (it names a count per cluster, and the number of live clusters changes)");
  if (!diloco && c.parallel.zero != 0 && c.parallel.dp_shard <= 0)
    throw UsageError("elastic training needs whole copies of the state, but parallel.zero = " +
                     std::to_string(c.parallel.zero) + " shards it over every data-parallel rank: set parallel.dp_shard "
                     "to a divisor of them (HSDP: ZeRO inside groups of that many ranks, a copy per group, and a "
                     "replica is one group), or parallel.zero = 0");
  if (c.elastic.heartbeat_ms < 10 || c.elastic.failure_timeout_ms < 2 * c.elastic.heartbeat_ms)
    throw UsageError("elastic.heartbeat_ms must be at least 10 and elastic.failure_timeout_ms at least twice it (got " +
                     std::to_string(c.elastic.heartbeat_ms) + " and " + std::to_string(c.elastic.failure_timeout_ms) + ")");
  if (diloco && !c.sync.cluster_ranks.empty()) sized_clusters(job_dp(c, world), parse_cluster_ranks(c.sync.cluster_ranks));
  if (diloco && c.sync.cluster_ranks.empty() && job_dp(c, world) % c.sync.clusters != 0)
    throw UsageError("sync.clusters = " + std::to_string(c.sync.clusters) + " must divide the " +
                     std::to_string(job_dp(c, world)) + " data-parallel ranks");
  const int replicas = job_replicas(c, world);
  if (c.elastic.min_replicas < 1 || c.elastic.min_replicas > replicas)
    throw UsageError("elastic.min_replicas = " + std::to_string(c.elastic.min_replicas) + " must be between 1 and the " +
                     std::to_string(replicas) + " replicas of this job");
}

namespace {

// This rank's membership settings: its replica slot and replica size from the layout, the timing from [elastic].
elastic::MembershipOptions membership_options(const Config& c, int rank, int world) {
  elastic::MembershipOptions o;
  if (is_dlrm(c)) {
    o.replica = 0;  // one replica: every rank
    o.replica_size = world;
  } else {
    const parallel::ParallelDims dims = models::gpt_dims(c.model, c.parallel, c.train.micro_batches, world);
    const std::vector<int> widths = replica_widths(c, dims.dp());
    const int dp = dims.shape.coords(rank).dp;
    int first = 0;
    o.replica = 0;
    while (dp >= first + widths.at(static_cast<size_t>(o.replica))) first += widths[static_cast<size_t>(o.replica++)];
    o.replica_size = dims.pp() * dims.tp() * widths[static_cast<size_t>(o.replica)];
  }
  o.timing.heartbeat_ms = static_cast<int>(c.elastic.heartbeat_ms);
  o.timing.failure_timeout_ms = static_cast<int>(c.elastic.failure_timeout_ms);
  o.timing.min_replicas = static_cast<int>(c.elastic.min_replicas);
  o.comm = c.comm;
  o.cluster = cluster_of_this_node(c.sync.topology);
  return o;
}

}  // namespace

TrainResult train_elastic(const Config& config, const LaunchEnv& env, const TrainOptions& options) {
  check_elastic_config(config, env.world_size);
  limit_compute_threads(static_cast<int>(config.train.threads_per_rank));
  keep_freed_memory_for_reuse();
  // Everything a process can do alone comes before it registers, since registering asks the members to take it
  // in: timed inside a generation, a joiner's GEMM peak (1.3 s, several under load) held every member.
  GemmPeak peak;
  if (config.train.peak_flops_per_rank <= 0 && !is_dlrm(config)) {
    const int dp = job_dp(config, env.world_size);
    const int64_t micro_batch = config.train.global_batch / dp / std::max<int64_t>(1, config.train.micro_batches);
    peak = measure_model_peak(config, micro_batch);
  }
  elastic::Membership membership(env, membership_options(config, env.rank, env.world_size));
  ElasticLoop loop(config, membership, options, std::move(peak));
  try {
    return loop.run();
  } catch (const elastic::JobFinished& e) {
    if (!options.quiet) std::fprintf(stderr, "crosstrain elastic: rank %d: %s; nothing to do\n", membership.rank(), e.what());
    return TrainResult{};
  }
}

}  // namespace crosstrain::train
