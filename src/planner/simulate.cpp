// The discrete-event replay of one training step; the rules are in the header.
//
// The loop: at the current time every rank that is free runs its actions until it starts a computation or blocks
// in a receive (repeated until no rank moves, since a send may unblock a rank visited earlier); then time jumps to
// the next event, the earliest of a computation ending, a flow leaving its latency, or a flow arriving. Flows in
// their bandwidth phase are advanced at their share of the link, and the shares are recomputed at every event.
#include "crosstrain/planner/simulate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>
#include <unordered_map>
#include <utility>

#include <nlohmann/json.hpp>

#include "crosstrain/core/error.h"

namespace crosstrain::planner {

namespace {

using parallel::Action;
using parallel::ActionType;
using Actions = std::vector<std::vector<Action>>;

constexpr double kNever = std::numeric_limits<double>::infinity();

bool is_activation(ActionType t) { return t == ActionType::SendActivation || t == ActionType::RecvActivation; }
bool is_send(ActionType t) { return t == ActionType::SendActivation || t == ActionType::SendGrad; }
bool is_recv(ActionType t) { return t == ActionType::RecvActivation || t == ActionType::RecvGrad; }

std::string count_error(const std::string& field, size_t got, const std::string& expected) {
  return "simulate: StepModel." + field + " has " + std::to_string(got) + " entries, expected " + expected;
}

void check_size(const std::string& field, size_t got, size_t expected, const std::string& why, bool may_be_empty) {
  if (got == expected || (may_be_empty && got == 0)) return;
  throw UsageError(count_error(field, got, std::to_string(expected) + " (" + why + ")" +
                                              (may_be_empty ? " or none" : "")));
}

void check_non_negative(const std::string& what, double value) {
  if (!(value >= 0) || std::isinf(value))
    throw UsageError("simulate: " + what + " must be a finite number >= 0, got " + std::to_string(value));
}

// Every size and value the replay reads, with the field that is wrong.
void validate_model(const StepModel& model) {
  const parallel::ScheduleSpec& spec = model.schedule;
  parallel::validate(spec);
  const size_t p = spec.stages, stages = p * spec.chunks;
  const std::string per_stage = "one per virtual stage: stages " + std::to_string(p) + " x chunks " +
                                std::to_string(spec.chunks);
  check_size("stages", model.stages.size(), stages, per_stage, false);
  check_size("boundary_link", model.boundary_link.size(), stages - 1, "one per boundary between virtual stages",
             false);
  check_size("boundary_resource", model.boundary_resource.size(), stages - 1, "one per boundary_link", true);
  check_size("dp_sync_s", model.dp_sync_s.size(), p, "one per pipeline rank", true);
  check_size("optimizer_s", model.optimizer_s.size(), p, "one per pipeline rank", true);
  check_size("dp_bytes", model.dp_bytes.size(), p, "one per pipeline rank", true);
  for (size_t s = 0; s < stages; ++s) {
    const StageCosts& c = model.stages[s];
    const std::string at = "StepModel.stages[" + std::to_string(s) + "].";
    check_non_negative(at + "forward_s", c.forward_s);
    check_non_negative(at + "backward_s", c.backward_s);
    check_non_negative(at + "backward_input_s", c.backward_input_s);
    check_non_negative(at + "backward_weight_s", c.backward_weight_s);
  }
  check_non_negative("StepModel.boundary_bytes", model.boundary_bytes);
  for (size_t b = 0; b < model.boundary_link.size(); ++b) {
    const comm::Link& link = model.boundary_link[b];
    const std::string at = "StepModel.boundary_link[" + std::to_string(b) + "]";
    if (link.one_way_curve.empty() && !(link.bandwidth_Bps > 0))
      throw UsageError("simulate: " + at + ".bandwidth_Bps must be > 0 (use infinity for a free link)");
    check_non_negative(at + " seconds for boundary_bytes", link.seconds(model.boundary_bytes));
  }
  for (double s : model.dp_sync_s) check_non_negative("StepModel.dp_sync_s entries", s);
  for (double s : model.optimizer_s) check_non_negative("StepModel.optimizer_s entries", s);
  if (!(model.dp_overlap >= 0 && model.dp_overlap <= 1))
    throw UsageError("simulate: StepModel.dp_overlap must be a fraction in [0, 1], got " +
                     std::to_string(model.dp_overlap));
  check_non_negative("StepModel.wan_s_per_step", model.wan_s_per_step);
}

std::string compute_name(const Action& a) {
  const char* kind = a.type == ActionType::Forward          ? "F"
                     : a.type == ActionType::Backward       ? "B"
                     : a.type == ActionType::BackwardInput  ? "Bi"
                                                            : "Bw";
  return std::string(kind) + " mb" + std::to_string(a.microbatch) + " c" + std::to_string(a.chunk);
}

// One activation or gradient message on its way.
struct Flow {
  int sender = 0;
  Action send;                 // the sender's action
  int resource = -1;
  double start = 0;            // when it was sent
  double data_start = 0;       // when its latency is over and it starts using bandwidth
  double work = 0;             // seconds of the link at full rate still needed after the latency
  double rate = 1;             // current share of the link (1: alone)
  bool in_data = false;
  double arrival = kNever;     // when it has fully arrived
};

struct RankState {
  size_t pc = 0;               // next action
  double free_at = 0;          // end of the computation it runs (<= now: free)
  double blocked_since = -1;   // when it started waiting in its current receive; -1: not waiting
  double finish = 0;           // when its last action ended
  double busy = 0, recv_wait = 0, transfer_wait = 0;
};

class Replay {
 public:
  Replay(const StepModel& model, const Actions& actions, bool trace)
      : model_(model), spec_(model.schedule), actions_(actions), trace_(trace),
        stages_(spec_.stages * spec_.chunks), ranks_(spec_.stages),
        message_flow_(2 * static_cast<size_t>(stages_) * spec_.microbatches, -1) {}

  // Runs every rank's list to its end; throws UsageError on a deadlock.
  void run() {
    for (;;) {
      while (step_ranks()) {
      }
      const double next = next_event();
      if (next == kNever) break;
      advance_flows(next);
      now_ = next;
    }
    std::string blocked = describe_blocked();
    if (!blocked.empty())
      throw UsageError("simulate: deadlock at t = " + std::to_string(now_) + " s: " + blocked +
                       "; the action lists do not match (check them with parallel::check_schedule)");
  }

  SimulationReport report() const;

 private:
  bool finished(int r) const { return ranks_[r].pc == actions_[r].size(); }

  // Runs rank r's actions at the current time while it is free; true when it moved.
  bool step_rank(int r) {
    RankState& st = ranks_[r];
    bool moved = false;
    while (st.free_at <= now_ && !finished(r)) {
      const Action& a = actions_[r][st.pc];
      check_action(r, a);
      if (is_recv(a.type)) {
        if (!receive(r, a)) break;
      } else if (is_send(a.type)) {
        start_flow(r, a);
      } else {
        const double cost = compute_cost(r, a);
        if (trace_) computes_.push_back({r, compute_name(a), "compute", now_, now_ + cost});
        st.busy += cost;
        st.free_at = now_ + cost;
      }
      ++st.pc;
      moved = true;
      if (finished(r)) st.finish = std::max(st.free_at, now_);
    }
    return moved;
  }
  bool step_ranks() {
    bool moved = false;
    for (int r = 0; r < spec_.stages; ++r) moved = step_rank(r) || moved;
    return moved;
  }

  void check_action(int r, const Action& a) const {
    if (a.microbatch < 0 || a.microbatch >= spec_.microbatches || a.chunk < 0 || a.chunk >= spec_.chunks)
      throw UsageError("simulate: rank " + std::to_string(r) + ", " + parallel::to_string(a) +
                       ": micro-batch or chunk out of range (microbatches " +
                       std::to_string(spec_.microbatches) + ", chunks " + std::to_string(spec_.chunks) + ")");
    if (is_send(a.type) || is_recv(a.type)) parallel::peer_of(spec_, r, a);  // throws when there is no peer
  }

  double compute_cost(int r, const Action& a) const {
    const StageCosts& c = model_.stages[parallel::virtual_stage(spec_, r, a.chunk)];
    switch (a.type) {
      case ActionType::Forward: return c.forward_s;
      case ActionType::Backward: return c.backward_s;
      case ActionType::BackwardInput: return c.backward_input_s;
      default: return c.backward_weight_s;
    }
  }

  // The flow slot of a message: by kind, receiving virtual stage and micro-batch.
  int& message(ActionType t, int receiving_stage, int mb) {
    const size_t kind = is_activation(t) ? 0 : 1;
    return message_flow_[(kind * stages_ + receiving_stage) * spec_.microbatches + mb];
  }

  void start_flow(int r, const Action& a) {
    const int from = parallel::virtual_stage(spec_, r, a.chunk);
    const int to = a.type == ActionType::SendActivation ? from + 1 : from - 1;
    int& slot = message(a.type, to, a.microbatch);
    if (slot >= 0)
      throw UsageError("simulate: rank " + std::to_string(r) + " sends " + parallel::to_string(a) +
                       " twice; each message goes once");
    const int boundary = std::min(from, to);
    const comm::Link& link = model_.boundary_link[boundary];
    const double total = link.seconds(model_.boundary_bytes);
    const double latency = std::clamp(link.seconds(0), 0.0, total);
    Flow f;
    f.sender = r;
    f.send = a;
    f.resource = model_.boundary_resource.empty() ? -1 : model_.boundary_resource[boundary];
    f.start = now_;
    f.data_start = now_ + latency;
    f.work = total - latency;
    slot = static_cast<int>(flows_.size());
    flows_.push_back(f);
    if (latency <= 0) enter_data_phase(flows_.back(), now_);
    if (flows_.back().arrival == kNever) active_.push_back(slot);
  }

  static void enter_data_phase(Flow& f, double t) {
    f.in_data = true;
    if (f.work <= 0) f.arrival = t;
  }

  // A receive completes when its flow has arrived; the wait before is bubble until the send, transfer after.
  bool receive(int r, const Action& a) {
    RankState& st = ranks_[r];
    const int id = message(a.type, parallel::virtual_stage(spec_, r, a.chunk), a.microbatch);
    const bool arrived = id >= 0 && flows_[id].arrival <= now_;
    if (!arrived) {
      if (st.blocked_since < 0) st.blocked_since = now_;
      return false;
    }
    if (st.blocked_since >= 0) {
      st.recv_wait += now_ - st.blocked_since;
      st.transfer_wait += now_ - std::max(st.blocked_since, flows_[id].start);
      st.blocked_since = -1;
    }
    return true;
  }

  // Shares of the flows using bandwidth: equal among those on one resource, whole on a private link.
  void update_rates() {
    resource_load_.clear();
    for (int id : active_)
      if (flows_[id].in_data && flows_[id].resource >= 0) ++resource_load_[flows_[id].resource];
    for (int id : active_) {
      Flow& f = flows_[id];
      f.rate = f.resource >= 0 && f.in_data ? 1.0 / resource_load_[f.resource] : 1.0;
    }
  }

  double next_event() {
    double next = kNever;
    for (const RankState& st : ranks_)
      if (st.free_at > now_) next = std::min(next, st.free_at);
    update_rates();
    for (int id : active_) {
      const Flow& f = flows_[id];
      next = std::min(next, f.in_data ? now_ + f.work / f.rate : f.data_start);
    }
    return next;
  }

  // Moves every flow from now_ to t (the next event, so no share changes in between).
  void advance_flows(double t) {
    const double tolerance = 1e-12 * std::max(1.0, std::abs(t));
    for (int id : active_) {
      Flow& f = flows_[id];
      if (f.in_data) {
        if (now_ + f.work / f.rate <= t + tolerance) {
          f.work = 0;
          f.arrival = t;
        } else {
          f.work -= (t - now_) * f.rate;
        }
      } else if (f.data_start <= t + tolerance) {
        enter_data_phase(f, t);
      }
    }
    active_.erase(std::remove_if(active_.begin(), active_.end(),
                                 [&](int id) { return flows_[id].arrival != kNever; }),
                  active_.end());
  }

  std::string describe_blocked() const {
    std::ostringstream os;
    for (int r = 0; r < spec_.stages; ++r) {
      if (finished(r)) continue;
      const Action& a = actions_[r][ranks_[r].pc];
      if (os.tellp() > 0) os << "; ";
      os << "rank " << r << " waits at action " << ranks_[r].pc << " (" << parallel::to_string(a)
         << " from rank " << parallel::peer_of(spec_, r, a).rank << ", never sent)";
    }
    return os.str();
  }

  const StepModel& model_;
  const parallel::ScheduleSpec& spec_;
  const Actions& actions_;
  const bool trace_;
  const int stages_;
  double now_ = 0;
  std::vector<RankState> ranks_;
  std::vector<int> message_flow_;  // flow id of each message, -1 until sent
  std::vector<Flow> flows_;
  std::vector<int> active_;        // flows not yet arrived
  std::unordered_map<int, int> resource_load_;
  std::vector<SimulatedSpan> computes_;
};

double at_or_zero(const std::vector<double>& v, int i) { return v.empty() ? 0.0 : v[i]; }

SimulationReport Replay::report() const {
  const int p = spec_.stages;
  SimulationReport out;
  std::vector<SimulatedSpan> tail;  // dp sync, optimizer, wan
  double optimizer_end = 0;
  for (int r = 0; r < p; ++r) {
    const RankState& st = ranks_[r];
    out.busy_s.push_back(st.busy);
    out.recv_wait_s.push_back(st.recv_wait);
    // Only one micro-batch's backward can hide the synchronisation (the gradients are ready after it): the rule
    // of the analytic estimate (estimate.cpp), so that both read the same inputs the same way.
    double backward = 0;
    for (size_t vs = r; vs < model_.stages.size(); vs += p) backward += model_.stages[vs].backward_s;
    const double sync = at_or_zero(model_.dp_sync_s, r);
    const double dp_end = st.finish + sync - model_.dp_overlap * std::min(sync, backward);
    const double end = dp_end + at_or_zero(model_.optimizer_s, r);
    if (dp_end > st.finish) tail.push_back({r, "dp sync", "dp", st.finish, dp_end});
    if (end > dp_end) tail.push_back({r, "optimizer", "optimizer", dp_end, end});
    if (r == 0 || end > optimizer_end) {
      optimizer_end = end;
      out.critical_rank = r;
    }
  }
  out.step_s = optimizer_end + model_.wan_s_per_step;
  out.pp_transfer_s = ranks_[out.critical_rank].transfer_wait;
  if (!trace_) return out;

  if (model_.wan_s_per_step > 0)
    for (int r = 0; r < p; ++r) tail.push_back({r, "wan exchange", "wan", optimizer_end, out.step_s});
  out.spans = computes_;
  for (const Flow& f : flows_) {
    const std::string kind = f.send.type == ActionType::SendActivation ? "send act" : "send grad";
    out.spans.push_back({f.sender, kind + " mb" + std::to_string(f.send.microbatch) + " c" +
                                       std::to_string(f.send.chunk),
                         "transfer", f.start, f.arrival});
  }
  out.spans.insert(out.spans.end(), tail.begin(), tail.end());
  std::stable_sort(out.spans.begin(), out.spans.end(),
                   [](const SimulatedSpan& a, const SimulatedSpan& b) { return a.start_s < b.start_s; });
  return out;
}

// Chrome trace events, written directly (a JSON value per event costs more than the replay itself). Transfers
// overlap the sender's computations and one another, and a track of "X" events must nest, so each rank's
// transfers go on lanes of their own, a new lane whenever all others are still busy.
class TraceWriter {
 public:
  explicit TraceWriter(int p) : p_(p), lane_end_(p) {
    out_ = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
    for (int r = 0; r < p; ++r) thread(r, "pp rank " + std::to_string(r), r * 1000);
  }
  // Spans in start order, so a greedy lane choice never overlaps.
  void add(const SimulatedSpan& s) {
    char numbers[96];
    std::snprintf(numbers, sizeof numbers, ",\"ts\":%.3f,\"dur\":%.3f}", s.start_s * 1e6,
                  (s.end_s - s.start_s) * 1e6);
    event("X", s.category == "transfer" ? transfer_tid(s) : s.pp_rank, s.name);
    out_ += ",\"cat\":" + nlohmann::json(s.category).dump() + numbers;
  }
  std::string take() { return std::move(out_) + "]}"; }

 private:
  int transfer_tid(const SimulatedSpan& s) {
    std::vector<double>& lanes = lane_end_[s.pp_rank];
    size_t lane = 0;
    while (lane < lanes.size() && lanes[lane] > s.start_s) ++lane;
    const int tid = p_ * static_cast<int>(lane + 1) + s.pp_rank;
    if (lane == lanes.size()) {
      lanes.push_back(0);
      thread(tid, "pp rank " + std::to_string(s.pp_rank) + " sends" + (lane ? " " + std::to_string(lane + 1) : ""),
             s.pp_rank * 1000 + static_cast<int>(lane) + 1);
    }
    lanes[lane] = s.end_s;
    return tid;
  }
  void thread(int tid, const std::string& name, int sort_index) {
    event("M", tid, "thread_name");
    out_ += ",\"args\":{\"name\":" + nlohmann::json(name).dump() + "}}";
    event("M", tid, "thread_sort_index");
    out_ += ",\"args\":{\"sort_index\":" + std::to_string(sort_index) + "}}";
  }
  // Opens an event object with its common fields; the caller appends the rest and the closing brace.
  void event(const char* phase, int tid, const std::string& name) {
    if (out_.back() != '[') out_ += ',';
    out_ += "{\"ph\":\"" + std::string(phase) + "\",\"pid\":0,\"tid\":" + std::to_string(tid) +
            ",\"name\":" + nlohmann::json(name).dump();
  }

  int p_;
  std::vector<std::vector<double>> lane_end_;  // [rank][lane] end of its last transfer
  std::string out_;
};

std::string perfetto_json(const std::vector<SimulatedSpan>& spans, int p) {
  TraceWriter writer(p);
  for (const SimulatedSpan& s : spans) writer.add(s);
  return writer.take();
}

}  // namespace

SimulationReport simulate_step(const StepModel& model, const Actions& actions, const SimulationOptions& options) {
  validate_model(model);
  if (static_cast<int>(actions.size()) != model.schedule.stages)
    throw UsageError("simulate: expected action lists for " + std::to_string(model.schedule.stages) +
                     " pipeline ranks, got " + std::to_string(actions.size()));
  Replay replay(model, actions, options.trace);
  replay.run();
  SimulationReport report = replay.report();
  if (options.trace) report.perfetto_json = perfetto_json(report.spans, model.schedule.stages);
  return report;
}

SimulationReport simulate_step(const StepModel& model, const SimulationOptions& options) {
  validate_model(model);  // before build_schedule, so a bad schedule is reported as the StepModel's
  return simulate_step(model, parallel::build_schedule(model.schedule), options);
}

}  // namespace crosstrain::planner
