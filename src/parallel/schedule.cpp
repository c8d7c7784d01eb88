// Pipeline schedules as action lists; see the header for the layout and the invariants.
#include "crosstrain/parallel/schedule.h"

#include <algorithm>
#include <sstream>
#include <utility>

#include "crosstrain/core/error.h"

namespace crosstrain::parallel {

namespace {

constexpr const char* kScheduleNames = "gpipe, 1f1b, interleaved, zb-h1, zb-h2";

int last_stage(const ScheduleSpec& spec) { return spec.stages * spec.chunks - 1; }

bool is_compute(ActionType t) {
  return t == ActionType::Forward || t == ActionType::Backward || t == ActionType::BackwardInput ||
         t == ActionType::BackwardWeight;
}

// Appends one rank's actions, wrapping each compute in the receive it needs and the send it feeds, so that the
// schedule functions below only decide the order of computations.
class RankProgram {
 public:
  RankProgram(const ScheduleSpec& spec, int rank) : spec_(spec), rank_(rank) {}

  void forward(int mb, int chunk) {
    int s = virtual_stage(spec_, rank_, chunk);
    if (s > 0) push(ActionType::RecvActivation, mb, chunk);
    push(ActionType::Forward, mb, chunk);
    if (s < last_stage(spec_)) push(ActionType::SendActivation, mb, chunk);
  }
  // A full backward, or with zero bubble its input half: the part the previous stage waits for.
  void backward(int mb, int chunk, ActionType type = ActionType::Backward) {
    int s = virtual_stage(spec_, rank_, chunk);
    if (s < last_stage(spec_)) push(ActionType::RecvGrad, mb, chunk);  // the last stage has the loss
    push(type, mb, chunk);
    if (s > 0) push(ActionType::SendGrad, mb, chunk);
  }
  void backward_weight(int mb, int chunk) { push(ActionType::BackwardWeight, mb, chunk); }

  std::vector<Action> take() { return std::move(actions_); }

 private:
  void push(ActionType type, int mb, int chunk) { actions_.push_back({type, mb, chunk}); }

  const ScheduleSpec& spec_;
  int rank_;
  std::vector<Action> actions_;
};

// GPipe: fill the pipeline with every micro-batch, then drain it. Simple, and holds all m activations.
std::vector<Action> gpipe(const ScheduleSpec& spec, int rank) {
  RankProgram prog(spec, rank);
  for (int mb = 0; mb < spec.microbatches; ++mb) prog.forward(mb, 0);
  for (int mb = 0; mb < spec.microbatches; ++mb) prog.backward(mb, 0);
  return prog.take();
}

// 1F1B: in step x rank r runs forward x, then backward x - lag. With lag = p-1-r, the gradient of that backward
// has just come back from the last stage, so each rank starts backwards as early as possible and holds at most
// lag + 1 = p - r activations. Steps with only a forward are the warm-up, steps with only a backward the cool-down.
std::vector<Action> one_f_one_b(const ScheduleSpec& spec, int rank) {
  RankProgram prog(spec, rank);
  const int m = spec.microbatches, lag = spec.stages - 1 - rank;
  for (int x = 0; x < m + lag; ++x) {
    if (x < m) prog.forward(x, 0);
    if (x >= lag) prog.backward(x - lag, 0);
  }
  return prog.take();
}

// ZB-H1: 1F1B with the backward split in two. Input gradients keep 1F1B's lag p-1-r, so they travel back as early
// as possible; weight gradients, which nobody waits for, lag p-1 on every rank. Rank r thus keeps r of them in
// reserve and spends them at the end, where 1F1B leaves it idle while the last gradients drain to rank 0.
// The price: every rank holds up to p activations (rank 0's peak in 1F1B) instead of p - r.
std::vector<Action> zero_bubble_h1(const ScheduleSpec& spec, int rank) {
  RankProgram prog(spec, rank);
  const int m = spec.microbatches, input_lag = spec.stages - 1 - rank, weight_lag = spec.stages - 1;
  for (int x = 0; x < m + weight_lag; ++x) {
    if (x < m) prog.forward(x, 0);
    if (x >= input_lag && x - input_lag < m) prog.backward(x - input_lag, 0, ActionType::BackwardInput);
    if (x >= weight_lag) prog.backward_weight(x - weight_lag, 0);
  }
  return prog.take();
}

// ZB-H2: more forwards in the warm-up fill the time before the first input gradient arrives, and weight gradients
// fill the rest; every rank may hold 2p-1 micro-batches until their weight gradients are done (the paper's bound;
// with rank r's bound shrinking with r, as 1F1B's does, the last stages stall on their own weight gradients).
// The order comes from running every rank with unit costs (F = B_input = W = 1, messages free): a free rank runs
// the input gradient that has arrived, else the next forward whose input has arrived if the bound allows, else
// its oldest pending weight gradient, else waits. Forwards and input gradients go in micro-batch order, so
// every pair of ranks sends and receives in the same order.
struct GreedyRank {
  int next_forward = 0, next_backward = 0, in_flight = 0, limit = 1;
  std::vector<int> pending_weights;
  std::vector<std::pair<ActionType, int>> order;
};

std::vector<std::vector<std::pair<ActionType, int>>> zero_bubble_h2_orders(const ScheduleSpec& spec) {
  const int p = spec.stages, m = spec.microbatches;
  constexpr int kNever = 1 << 30;
  // Time each rank's forward / input gradient of each micro-batch ends (kNever: not yet run).
  std::vector<std::vector<int>> forward_end(p, std::vector<int>(m, kNever)), backward_end = forward_end;
  std::vector<GreedyRank> ranks(p);
  for (int r = 0; r < p; ++r) ranks[r].limit = std::min(m, 2 * p - 1);
  int remaining = 3 * m * p;
  for (int t = 0; remaining > 0; ++t) {
    for (int r = 0; r < p; ++r) {
      GreedyRank& g = ranks[r];
      const int b = g.next_backward, f = g.next_forward;
      const bool b_ready = b < m && forward_end[r][b] <= t && (r == p - 1 || backward_end[r + 1][b] <= t);
      const bool f_ready = f < m && g.in_flight < g.limit && (r == 0 || forward_end[r - 1][f] <= t);
      if (b_ready) {
        backward_end[r][b] = t + 1;
        g.order.push_back({ActionType::BackwardInput, b});
        g.pending_weights.push_back(b);
        ++g.next_backward;
      } else if (f_ready) {
        forward_end[r][f] = t + 1;
        g.order.push_back({ActionType::Forward, f});
        ++g.in_flight;
        ++g.next_forward;
      } else if (!g.pending_weights.empty()) {
        g.order.push_back({ActionType::BackwardWeight, g.pending_weights.front()});
        g.pending_weights.erase(g.pending_weights.begin());
        --g.in_flight;
      } else {
        continue;  // idle this time unit
      }
      --remaining;
    }
    if (t > 3 * m * p + 2 * p) throw Error("zb-h2: the unit-cost construction did not finish (a bug)");
  }
  std::vector<std::vector<std::pair<ActionType, int>>> orders;
  for (auto& g : ranks) orders.push_back(std::move(g.order));
  return orders;
}

std::vector<Action> zero_bubble_h2(const ScheduleSpec& spec, int rank) {
  RankProgram prog(spec, rank);
  const auto orders = zero_bubble_h2_orders(spec);  // every rank's: the order comes from running them together
  for (const auto& [type, mb] : orders[rank]) {
    if (type == ActionType::Forward) prog.forward(mb, 0);
    if (type == ActionType::BackwardInput) prog.backward(mb, 0, ActionType::BackwardInput);
    if (type == ActionType::BackwardWeight) prog.backward_weight(mb, 0);
  }
  return prog.take();
}

// Interleaved 1F1B (Megatron): the k-th computation of a rank walks micro-batches through its chunks in groups
// of p: p micro-batches through chunk 0, the same p through chunk 1, ..., then the next group. Backwards walk the
// chunks in reverse. With the groups the same on every rank, the chunk a rank sends to next is the chunk its
// neighbour will compute next, so activations flow without reordering. Returns (micro-batch, chunk) of the k-th.
std::pair<int, int> interleaved_unit(const ScheduleSpec& spec, int k, bool backward) {
  const int p = spec.stages, v = spec.chunks;
  const int chunk = (k / p) % v;
  return {(k / (p * v)) * p + k % p, backward ? v - 1 - chunk : chunk};
}

// Then 1F1B over the m*v chunk computations, with a longer warm-up: before its first backward (micro-batch 0 on
// its last chunk) rank r runs the first group through its other chunks, (v-1)*p forwards, and keeps going while
// that micro-batch travels to rank p-1 and its gradient comes back: 2*(p-1-r) more.
std::vector<Action> interleaved(const ScheduleSpec& spec, int rank) {
  RankProgram prog(spec, rank);
  const int p = spec.stages, total = spec.microbatches * spec.chunks;
  const int warmup = std::min(total, (spec.chunks - 1) * p + 2 * (p - 1 - rank));
  for (int x = 0; x < total + warmup; ++x) {
    if (x < total) {
      auto [mb, chunk] = interleaved_unit(spec, x, false);
      prog.forward(mb, chunk);
    }
    if (x >= warmup) {
      auto [mb, chunk] = interleaved_unit(spec, x - warmup, true);
      prog.backward(mb, chunk);
    }
  }
  return prog.take();
}

// ---- checking -------------------------------------------------------------------------------------------------

// Where each action of one (micro-batch, chunk) sits in a rank's list; -1 when absent.
struct UnitPositions {
  int of[8] = {-1, -1, -1, -1, -1, -1, -1, -1};  // indexed by ActionType
  int& at(ActionType t) { return of[static_cast<int>(t)]; }
};

std::string where(int rank, int pos, const Action& a) {
  std::ostringstream os;
  os << "rank " << rank << ", action " << pos << " (" << to_string(a) << ")";
  return os.str();
}

// Per-rank checks: ranges, counts, and the order of the actions of each (micro-batch, chunk).
std::string check_rank(const ScheduleSpec& spec, int rank, const std::vector<Action>& actions) {
  const int m = spec.microbatches, v = spec.chunks, last = last_stage(spec);
  const bool zb = splits_backward(spec.kind);
  std::vector<UnitPositions> units(static_cast<size_t>(m) * v);
  for (int i = 0; i < static_cast<int>(actions.size()); ++i) {
    const Action& a = actions[i];
    if (a.microbatch < 0 || a.microbatch >= m || a.chunk < 0 || a.chunk >= v)
      return where(rank, i, a) + ": micro-batch or chunk out of range (m = " + std::to_string(m) +
             ", chunks = " + std::to_string(v) + ")";
    const int s = virtual_stage(spec, rank, a.chunk);
    switch (a.type) {
      case ActionType::Backward:
        if (zb) return where(rank, i, a) + ": zero-bubble schedules split every backward into BackwardInput and BackwardWeight";
        break;
      case ActionType::BackwardInput:
      case ActionType::BackwardWeight:
        if (!zb) return where(rank, i, a) + ": only zero-bubble schedules split the backward";
        break;
      case ActionType::RecvActivation:
        if (s == 0) return where(rank, i, a) + ": virtual stage 0 reads its input from data, not from a peer";
        break;
      case ActionType::SendActivation:
        if (s == last) return where(rank, i, a) + ": the last virtual stage has no successor";
        break;
      case ActionType::RecvGrad:
        if (s == last) return where(rank, i, a) + ": the last virtual stage computes its gradient from the loss";
        break;
      case ActionType::SendGrad:
        if (s == 0) return where(rank, i, a) + ": virtual stage 0 has no predecessor";
        break;
      case ActionType::Forward:
        break;
    }
    int& pos = units[static_cast<size_t>(a.microbatch) * v + a.chunk].at(a.type);
    if (pos >= 0) return where(rank, i, a) + ": duplicate of action " + std::to_string(pos);
    pos = i;
  }

  for (int mb = 0; mb < m; ++mb) {
    for (int c = 0; c < v; ++c) {
      UnitPositions& u = units[static_cast<size_t>(mb) * v + c];
      const int s = virtual_stage(spec, rank, c);
      const std::string unit = "rank " + std::to_string(rank) + ", micro-batch " + std::to_string(mb) +
                               ", chunk " + std::to_string(c) + " (virtual stage " + std::to_string(s) + ")";
      const ActionType bwd = zb ? ActionType::BackwardInput : ActionType::Backward;
      const int f = u.at(ActionType::Forward), b = u.at(bwd);
      if (f < 0) return unit + ": no Forward";
      if (b < 0) return unit + ": no " + to_string(bwd);
      if (b < f) return unit + ": " + to_string(bwd) + " before its Forward";
      if (zb) {
        int w = u.at(ActionType::BackwardWeight);
        if (w < 0) return unit + ": no BackwardWeight";
        if (w < b) return unit + ": BackwardWeight before its BackwardInput";
      }
      struct Need {
        ActionType type;
        bool needed;
        int must_follow;   // position it must come after, or -1
        int must_precede;  // position it must come before, or -1
      };
      const Need needs[] = {
          {ActionType::RecvActivation, s > 0, -1, f},
          {ActionType::SendActivation, s < last, f, -1},
          {ActionType::RecvGrad, s < last, -1, b},
          {ActionType::SendGrad, s > 0, b, -1},
      };
      for (const Need& n : needs) {
        int pos = u.at(n.type);
        if (n.needed && pos < 0) return unit + ": no " + to_string(n.type);
        if (n.needed && n.must_follow >= 0 && pos < n.must_follow)
          return unit + ": " + to_string(n.type) + " before the compute that produces it";
        if (n.needed && n.must_precede >= 0 && pos > n.must_precede)
          return unit + ": " + to_string(n.type) + " after the compute that needs it";
      }
    }
  }

  if (rank == 0) {  // virtual stage 0 is chunk 0 of rank 0
    int expected = 0;
    for (int i = 0; i < static_cast<int>(actions.size()); ++i) {
      const Action& a = actions[i];
      if (a.type == ActionType::Forward && a.chunk == 0 && a.microbatch != expected++)
        return where(rank, i, a) + ": micro-batches must enter virtual stage 0 in order 0..m-1";
    }
  }
  return "";
}

// For every ordered pair of ranks and each kind of message, the sender's order must be the receiver's order.
std::string check_message_order(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& actions) {
  const int p = spec.stages;
  // [kind][from][to] -> sequence of (micro-batch, receiving virtual stage)
  using Seq = std::vector<std::pair<int, int>>;
  std::vector<std::vector<std::vector<Seq>>> sent(2, std::vector<std::vector<Seq>>(p, std::vector<Seq>(p)));
  auto received = sent;
  for (int r = 0; r < p; ++r) {
    for (const Action& a : actions[r]) {
      if (is_compute(a.type)) continue;
      const bool send = a.type == ActionType::SendActivation || a.type == ActionType::SendGrad;
      const int kind = (a.type == ActionType::SendActivation || a.type == ActionType::RecvActivation) ? 0 : 1;
      const Peer peer = peer_of(spec, r, a);
      if (send)
        sent[kind][r][peer.rank].push_back({a.microbatch, virtual_stage(spec, peer.rank, peer.chunk)});
      else
        received[kind][peer.rank][r].push_back({a.microbatch, virtual_stage(spec, r, a.chunk)});
    }
  }
  const char* kinds[] = {"activations", "gradients"};
  for (int kind = 0; kind < 2; ++kind) {
    for (int from = 0; from < p; ++from) {
      for (int to = 0; to < p; ++to) {
        const Seq& s = sent[kind][from][to];
        const Seq& q = received[kind][from][to];
        for (size_t i = 0; i < std::min(s.size(), q.size()); ++i) {
          if (s[i] == q[i]) continue;
          std::ostringstream os;
          os << "rank " << from << " sends " << kinds[kind] << " to rank " << to << " in another order than rank "
             << to << " receives them: message " << i << " is micro-batch " << s[i].first << " for virtual stage "
             << s[i].second << ", but the receiver expects micro-batch " << q[i].first << " for virtual stage "
             << q[i].second;
          return os.str();
        }
      }
    }
  }
  return "";  // counts match: check_rank saw every send and receive exactly once
}

}  // namespace

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::GPipe;
  if (name == "1f1b") return ScheduleKind::OneFOneB;
  if (name == "interleaved") return ScheduleKind::Interleaved1F1B;
  if (name == "zb-h1") return ScheduleKind::ZeroBubbleH1;
  if (name == "zb-h2") return ScheduleKind::ZeroBubbleH2;
  throw UsageError("unknown pipeline schedule '" + name + "'; valid schedules: " + kScheduleNames);
}

bool splits_backward(ScheduleKind kind) {
  return kind == ScheduleKind::ZeroBubbleH1 || kind == ScheduleKind::ZeroBubbleH2;
}

const char* to_string(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::GPipe: return "gpipe";
    case ScheduleKind::OneFOneB: return "1f1b";
    case ScheduleKind::Interleaved1F1B: return "interleaved";
    case ScheduleKind::ZeroBubbleH1: return "zb-h1";
    case ScheduleKind::ZeroBubbleH2: return "zb-h2";
  }
  return "unknown";
}

const char* to_string(ActionType type) {
  switch (type) {
    case ActionType::Forward: return "Forward";
    case ActionType::Backward: return "Backward";
    case ActionType::BackwardInput: return "BackwardInput";
    case ActionType::BackwardWeight: return "BackwardWeight";
    case ActionType::RecvActivation: return "RecvActivation";
    case ActionType::SendActivation: return "SendActivation";
    case ActionType::RecvGrad: return "RecvGrad";
    case ActionType::SendGrad: return "SendGrad";
  }
  return "Unknown";
}

bool operator==(const Action& a, const Action& b) {
  return a.type == b.type && a.microbatch == b.microbatch && a.chunk == b.chunk;
}

std::string to_string(const Action& action) {
  return std::string(to_string(action.type)) + "(mb " + std::to_string(action.microbatch) + ", chunk " +
         std::to_string(action.chunk) + ")";
}

void validate(const ScheduleSpec& spec) {
  const std::string name = std::string("pipeline schedule ") + to_string(spec.kind) + ": ";
  if (spec.stages < 1) throw UsageError(name + "stages must be >= 1, got " + std::to_string(spec.stages));
  if (spec.microbatches < 1)
    throw UsageError(name + "microbatches must be >= 1, got " + std::to_string(spec.microbatches));
  if (spec.kind != ScheduleKind::Interleaved1F1B) {
    if (spec.chunks != 1)
      throw UsageError(name + "chunks must be 1 (only 'interleaved' holds several chunks per rank), got " +
                       std::to_string(spec.chunks));
    return;
  }
  if (spec.stages < 2)
    throw UsageError(name + "needs at least 2 stages (with one rank there is nothing to interleave; use 1f1b)");
  if (spec.chunks < 2)
    throw UsageError(name + "needs chunks >= 2 model chunks per rank, got " + std::to_string(spec.chunks) +
                     " (use 1f1b for one chunk)");
  if (spec.microbatches % spec.stages != 0)
    throw UsageError(name + "microbatches (" + std::to_string(spec.microbatches) +
                     ") must be a multiple of stages (" + std::to_string(spec.stages) + ")");
}

int virtual_stage(const ScheduleSpec& spec, int rank, int chunk) { return chunk * spec.stages + rank; }

Peer peer_of(const ScheduleSpec& spec, int rank, const Action& action) {
  int s = virtual_stage(spec, rank, action.chunk);
  switch (action.type) {
    case ActionType::RecvActivation:
    case ActionType::SendGrad: --s; break;
    case ActionType::SendActivation:
    case ActionType::RecvGrad: ++s; break;
    default: throw UsageError("peer_of: " + to_string(action) + " is not a send or receive");
  }
  if (s < 0 || s > last_stage(spec))
    throw UsageError("peer_of: " + to_string(action) + " on rank " + std::to_string(rank) +
                     " has no peer (virtual stage " + std::to_string(s) + " does not exist)");
  return {s % spec.stages, s / spec.stages};
}

std::vector<std::vector<Action>> build_schedule(const ScheduleSpec& spec) {
  validate(spec);
  std::vector<Action> (*build)(const ScheduleSpec&, int) = nullptr;
  switch (spec.kind) {
    case ScheduleKind::GPipe: build = gpipe; break;
    case ScheduleKind::OneFOneB: build = one_f_one_b; break;
    case ScheduleKind::Interleaved1F1B: build = interleaved; break;
    case ScheduleKind::ZeroBubbleH1: build = zero_bubble_h1; break;
    case ScheduleKind::ZeroBubbleH2: build = zero_bubble_h2; break;
  }
  std::vector<std::vector<Action>> actions;
  for (int rank = 0; rank < spec.stages; ++rank) actions.push_back(build(spec, rank));
  return actions;
}

int activation_bound(const ScheduleSpec& spec, int rank) {
  const int p = spec.stages, m = spec.microbatches;
  switch (spec.kind) {
    case ScheduleKind::GPipe: return m;
    case ScheduleKind::OneFOneB: return std::min(m, p - rank);
    case ScheduleKind::ZeroBubbleH1: return std::min(m, p);
    case ScheduleKind::ZeroBubbleH2: return std::min(m, 2 * p - 1);
    case ScheduleKind::Interleaved1F1B:
      return std::min(m * spec.chunks, (spec.chunks - 1) * p + 2 * (p - 1 - rank) + 1);
  }
  return m;
}

std::string check_schedule(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& actions) {
  validate(spec);
  if (static_cast<int>(actions.size()) != spec.stages)
    return "expected action lists for " + std::to_string(spec.stages) + " ranks, got " +
           std::to_string(actions.size());
  for (int rank = 0; rank < spec.stages; ++rank) {
    std::string problem = check_rank(spec, rank, actions[rank]);
    if (!problem.empty()) return problem;
  }
  std::string problem = check_message_order(spec, actions);
  if (!problem.empty()) return problem;

  SimulationResult sim = simulate(spec, actions);
  if (sim.deadlock) return "deadlock: " + sim.deadlock_detail;
  for (int rank = 0; rank < spec.stages; ++rank) {
    if (sim.peak_activations[rank] > activation_bound(spec, rank))
      return "rank " + std::to_string(rank) + " holds " + std::to_string(sim.peak_activations[rank]) +
             " activations at its peak; " + to_string(spec.kind) + " allows " +
             std::to_string(activation_bound(spec, rank));
  }
  return "";
}

SimulationResult simulate(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& actions,
                          const SimulationCosts& costs) {
  validate(spec);
  if (costs.forward < 0 || costs.backward < 0 || costs.backward_input < 0 ||
      costs.backward_input > costs.backward || costs.forward + costs.backward <= 0)
    throw UsageError("simulation costs need forward, backward >= 0 with a positive sum and "
                     "0 <= backward_input <= backward");
  const int p = spec.stages, m = spec.microbatches, v = spec.chunks, stages = p * v;
  if (static_cast<int>(actions.size()) != p)
    throw UsageError("simulate: expected action lists for " + std::to_string(p) + " ranks, got " +
                     std::to_string(actions.size()));

  // Time at which each message was sent, by kind, receiving virtual stage and micro-batch; < 0 until sent.
  std::vector<double> sent_at(2 * static_cast<size_t>(stages) * m, -1.0);
  auto slot = [&](ActionType t, int receiving_stage, int mb) -> double& {
    const int kind = (t == ActionType::SendActivation || t == ActionType::RecvActivation) ? 0 : 1;
    return sent_at[(static_cast<size_t>(kind) * stages + receiving_stage) * m + mb];
  };

  SimulationResult result;
  result.peak_activations.assign(p, 0);
  std::vector<size_t> pc(p, 0);
  std::vector<double> clock(p, 0.0);
  std::vector<int> in_flight(p, 0);
  // Executes one action of rank r; false when it is a receive whose message has not been sent yet.
  auto execute = [&](int r, const Action& a) {
    if (a.microbatch < 0 || a.microbatch >= m || a.chunk < 0 || a.chunk >= v)
      throw UsageError("simulate: rank " + std::to_string(r) + ", " + to_string(a) +
                       ": micro-batch or chunk out of range");
    switch (a.type) {
      case ActionType::Forward:
        clock[r] += costs.forward;
        result.peak_activations[r] = std::max(result.peak_activations[r], ++in_flight[r]);
        break;
      case ActionType::Backward: clock[r] += costs.backward; --in_flight[r]; break;
      case ActionType::BackwardInput: clock[r] += costs.backward_input; break;
      case ActionType::BackwardWeight: clock[r] += costs.backward - costs.backward_input; --in_flight[r]; break;
      case ActionType::SendActivation:
      case ActionType::SendGrad: {
        const Peer to = peer_of(spec, r, a);
        double& t = slot(a.type, virtual_stage(spec, to.rank, to.chunk), a.microbatch);
        if (t < 0) t = clock[r];
        break;
      }
      case ActionType::RecvActivation:
      case ActionType::RecvGrad: {
        peer_of(spec, r, a);  // throws when there is no peer to receive from
        const double t = slot(a.type, virtual_stage(spec, r, a.chunk), a.microbatch);
        if (t < 0) return false;
        clock[r] = std::max(clock[r], t);
        break;
      }
    }
    return true;
  };
  // Run every rank as far as it can; repeat while some rank moved. Send times do not depend on the order in
  // which ranks are visited, so neither does the result.
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      while (pc[r] < actions[r].size() && execute(r, actions[r][pc[r]])) {
        ++pc[r];
        progress = true;
      }
    }
  }

  std::ostringstream blocked;
  for (int r = 0; r < p; ++r) {
    if (pc[r] == actions[r].size()) continue;
    const Action& a = actions[r][pc[r]];
    if (result.deadlock) blocked << "; ";
    result.deadlock = true;
    blocked << "rank " << r << " waits at action " << pc[r] << " (" << to_string(a) << " from rank "
            << peer_of(spec, r, a).rank << ")";
  }
  if (result.deadlock) {
    result.deadlock_detail = blocked.str();
    return result;
  }
  result.makespan = *std::max_element(clock.begin(), clock.end());
  const double ideal = static_cast<double>(m) * v * (costs.forward + costs.backward);
  result.bubble_fraction = (result.makespan - ideal) / ideal;
  return result;
}

double theoretical_bubble(const ScheduleSpec& spec) {
  validate(spec);
  const double p = spec.stages, m = spec.microbatches, v = spec.chunks;
  switch (spec.kind) {
    case ScheduleKind::GPipe:
    case ScheduleKind::OneFOneB: return (p - 1) / m;
    case ScheduleKind::Interleaved1F1B: return (p - 1) / (v * m);
    case ScheduleKind::ZeroBubbleH1: return (p - 1) / (3 * m);
    // Within one synchronous step the last stage still starts (p-1) forwards late; the paper's zero bubble also
    // drops the optimizer's synchronisation between steps, which a step with a global gradient norm keeps.
    case ScheduleKind::ZeroBubbleH2: return (p - 1) / (3 * m);
  }
  return 0;
}

}  // namespace crosstrain::parallel
