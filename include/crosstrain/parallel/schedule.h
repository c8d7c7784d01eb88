// Pipeline-parallel schedules as data. Pure: no tensors, no communication.
//
// A schedule is, for every pipeline rank, the ordered list of actions it executes: compute a forward or backward
// of one micro-batch on one of its model chunks, or send/receive an activation or a gradient. The pipeline
// runtime executes the lists with tagged point-to-point messages; everything that can be checked without
// communication (every micro-batch done once, sends matched by receives in the same order, no deadlock, peak
// memory, bubble) is checked here.
//
//   ScheduleSpec spec{ScheduleKind::OneFOneB, /*stages=*/4, /*microbatches=*/8};
//   auto actions = build_schedule(spec);          // actions[rank] in execution order
//   assert(check_schedule(spec, actions).empty());
//   SimulationResult sim = simulate(spec, actions); // makespan, bubble, peak activations with unit costs
//
// Layout (Megatron's interleaved layout, and the plain one when chunks == 1): p = stages ranks, v = chunks model
// chunks per rank, p*v virtual stages. Virtual stage s lives on rank s % p as its local chunk s / p, so rank r
// holds virtual stages r, r+p, r+2p, ... Data flows through virtual stages 0..p*v-1; the loss is computed on the
// last one, p*v-1 (on rank p-1).
#pragma once

#include <string>
#include <vector>

namespace crosstrain::parallel {

enum class ScheduleKind {
  GPipe,            // all forwards, then all backwards
  OneFOneB,         // 1F1B (PipeDream-flush / Megatron): at most p - r micro-batches in flight on rank r
  Interleaved1F1B,  // Megatron's interleaved 1F1B over v >= 2 chunks per rank: bubble / v
  ZeroBubbleH1,     // ZB-H1 (Qi et al. 2023): backward split into input and weight grads, weight grads fill bubbles
  ZeroBubbleH2,     // ZB-H2: ZB-H1 with a longer warm-up (up to 2p-1 in flight on every rank) filling the start
};

// "gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2". Throws UsageError listing the valid names.
ScheduleKind parse_schedule(const std::string& name);
const char* to_string(ScheduleKind kind);
// Whether the schedule splits backward into input (BackwardInput) and weight (BackwardWeight) actions.
bool splits_backward(ScheduleKind kind);

enum class ActionType {
  Forward,
  Backward,        // full backward: input and weight gradients
  BackwardInput,   // zero-bubble: input gradient only (what the previous stage waits for)
  BackwardWeight,  // zero-bubble: weight gradient only (after its BackwardInput; nobody waits for it)
  RecvActivation,  // input of this virtual stage, from virtual stage s-1
  SendActivation,  // output of this virtual stage, to virtual stage s+1
  RecvGrad,        // gradient of this virtual stage's output, from virtual stage s+1
  SendGrad,        // gradient of this virtual stage's input, to virtual stage s-1
};
const char* to_string(ActionType type);

struct Action {
  ActionType type;
  int microbatch;
  int chunk;  // local chunk index on the executing rank, 0..chunks-1; its virtual stage is chunk * stages + rank
};
bool operator==(const Action& a, const Action& b);
inline bool operator!=(const Action& a, const Action& b) { return !(a == b); }
// "Forward(mb 3, chunk 1)"
std::string to_string(const Action& action);

struct ScheduleSpec {
  ScheduleKind kind;
  int stages;        // p: pipeline ranks
  int microbatches;  // m
  int chunks = 1;    // v: model chunks per rank; >= 2 for Interleaved1F1B, 1 otherwise
};

// Throws UsageError naming the problem when `spec` cannot be scheduled: stages or microbatches < 1; chunks != 1
// outside Interleaved1F1B; Interleaved1F1B with fewer than 2 stages, fewer than 2 chunks, or microbatches not a
// multiple of stages (Megatron's restriction: micro-batches go through the chunks in groups of p).
void validate(const ScheduleSpec& spec);

int virtual_stage(const ScheduleSpec& spec, int rank, int chunk);

// The other end of a Send/Recv action executed on `rank`: the peer rank and the peer's local chunk.
// Throws UsageError for a compute action or for a send/recv that has no peer (before stage 0, after the last).
struct Peer {
  int rank;
  int chunk;
};
Peer peer_of(const ScheduleSpec& spec, int rank, const Action& action);

// [rank] -> actions in execution order. Throws UsageError for an impossible spec (see validate).
// Receives come right before the compute that needs them and sends right after the compute that produced them;
// a runtime may post receives earlier as long as it keeps their order per peer.
std::vector<std::vector<Action>> build_schedule(const ScheduleSpec& spec);

// The bound on in-flight activations (micro-batch chunks forwarded but not yet fully backwarded, weight
// gradients included) that the built schedules meet, and reach, on `rank`:
//   GPipe         m
//   1F1B          min(m, p - rank)
//   ZB-H2         min(m, 2p - 1): the extra warm-up forwards (and weight gradients kept for the bubbles)
//   ZB-H1         min(m, p): deferring rank r's weight gradients by r micro-batches is what fills the bubble,
//                 so every rank holds as many as rank 0 does in 1F1B (the paper's "same peak memory as 1F1B")
//   Interleaved   min(m*v, (v-1)*p + 2*(p-1-rank) + 1) chunk activations (Megatron's warm-up + 1); each chunk
//                 holds 1/v of the rank's layers, so rank 0 holds about p*(1 + 1/v) stages' worth.
int activation_bound(const ScheduleSpec& spec, int rank);

// Invariant check, for tests and for the runtime at start-up: "" when `actions` is a valid schedule for `spec`,
// otherwise a description of the first violation (rank, position, action). Checks that
//  - every (micro-batch, chunk) is forwarded once and backwarded once per rank (ZB-H1: one BackwardInput and one
//    later BackwardWeight, never a full Backward; the others: one Backward), backward after forward;
//  - each compute has its receive before and its send after (none into virtual stage 0, none out of the last
//    virtual stage's forward, no gradient received by the last virtual stage), each exactly once;
//  - micro-batches enter virtual stage 0 in order 0..m-1;
//  - for every pair of ranks and each kind (activation, gradient), sends leave in the order the receiver
//    receives them, so one tag per kind and micro-batch never needs reordering;
//  - simulate() runs to the end without deadlock, within activation_bound() on every rank.
// Throws UsageError when `spec` itself is invalid.
std::string check_schedule(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& actions);

// Unit costs of the event simulation. A full Backward costs `backward`; BackwardInput costs `backward_input` and
// BackwardWeight the rest, backward - backward_input. Communication is free.
struct SimulationCosts {
  double forward = 1;
  double backward = 2;
  double backward_input = 1;
};

struct SimulationResult {
  bool deadlock = false;
  std::string deadlock_detail;  // every blocked rank and the receive it waits for
  double makespan = 0;          // time at which the last rank finishes
  double bubble_fraction = 0;   // (makespan - ideal) / ideal, ideal = m * v * (forward + backward)
  std::vector<int> peak_activations;  // per rank, see activation_bound()
};

// Executes the lists: each rank runs its actions in order; a Send never blocks; a Recv blocks until the matching
// Send (same micro-batch, from the neighbouring virtual stage) has executed. Reports a deadlock instead of
// looping. Throws UsageError for an invalid spec or costs, or an action that names no valid peer.
SimulationResult simulate(const ScheduleSpec& spec, const std::vector<std::vector<Action>>& actions,
                          const SimulationCosts& costs = {});

// The bubble fraction from the literature, in the convention of SimulationResult::bubble_fraction, for the
// default costs (f = 1, b = 2, and for ZB-H1 b_input = b_weight = 1):
//   GPipe, 1F1B   (p-1)/m       (Huang et al. 2019; Narayanan et al. 2021)
//   Interleaved   (p-1)/(v*m)   (Narayanan et al. 2021)
//   ZB-H1         (p-1)/(3m)    (Qi et al. 2023: (p-1)(f + b_input - b_weight) / (m(f + b)); for m >= p)
//   ZB-H2         (p-1)/(3m)    ((p-1)f / (m(f + b)): rank p-1's start-up only, whatever b_input and b_weight;
//                               the paper's zero also overlaps steps by dropping the optimizer's synchronisation)
// simulate() reaches these exactly. The first three hold for any f and b; ZB-H1's depends on the costs (and
// is never below (p-1)f/(m(f+b)), rank p-1's start-up, which ZB-H2 reaches when b_weight < b_input), so
// simulate the costs you have.
double theoretical_bubble(const ScheduleSpec& spec);

}  // namespace crosstrain::parallel
