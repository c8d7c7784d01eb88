// The pipeline runtime: executes this rank's action list of a schedule (schedule.h) with tagged point-to-point
// messages over the pipeline group. Sends are asynchronous (overlapping the next computation) and waited at the
// end of the step; receives wait with the communicator's timeout. The model side is a set of callbacks, so the
// runtime knows nothing of GPTs.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <vector>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/parallel/schedule.h"
#include "crosstrain/parallel/weight_grad_store.h"

namespace crosstrain::parallel {

struct PipelineModel {
  // Forward of local `chunk` for micro-batch `mb`. `input` is the received activation (undefined on the first
  // virtual stage, which reads its tokens itself). On the last virtual stage it returns the micro-batch's loss
  // (already scaled by 1/microbatches), elsewhere the activation to send.
  std::function<at::Tensor(int chunk, int mb, const at::Tensor& input)> forward;
  // Parameters of a chunk (the weight-gradient pass of zero-bubble schedules computes only these).
  std::function<std::vector<at::Tensor>(int chunk)> parameters;
  // Zero-bubble schedules: the store the model's linear layers defer their weight gradients to. With it the
  // input pass is one backward that keeps (X, dY) per linear layer and frees the graph, and the weight pass is
  // one product per layer; without it (null) the input pass keeps the graph and the weight pass walks it again.
  WeightGradStore* weight_grads = nullptr;
  // Shape and dtype of the activations passed between stages.
  std::vector<int64_t> activation_shape;
  at::ScalarType activation_dtype = at::kFloat;
};

class PipelineRuntime {
 public:
  // `group`: the pipeline group (its ranks are pipeline stages, in order). The schedule is checked at once.
  PipelineRuntime(ScheduleSpec spec, comm::Communicator* group, int stage, PipelineModel model);

  // One training step: runs every action; weight gradients accumulate in the parameters' .grad.
  // Returns the sum of this rank's micro-batch losses (non-zero only where the last virtual stage lives).
  double train_step();
  // Forward only (validation): all micro-batches through every stage, GPipe order. Same return value.
  double eval_step();

  // Per-action timings of the last step (for timelines: seconds since the step started).
  struct Event {
    Action action;
    double start_s, end_s;
  };
  const std::vector<Event>& timeline() const { return timeline_; }
  const ScheduleSpec& spec() const { return spec_; }
  bool holds_last_stage() const;

 private:
  struct Slot {
    at::Tensor input, output, output_grad, input_grad;
  };
  int tag(ActionType kind, int mb, int virtual_stage) const;
  static std::vector<at::Tensor> output_grads(const Slot& s, bool last);
  // Backward of the slot's output (input and parameter gradients); frees its graph.
  static void run_backward(Slot& s, bool last);
  // A receive in flight: its buffer and the work to wait for.
  struct Received {
    at::Tensor buffer;
    comm::WorkPtr work;
  };
  Received post_receive(const Action& a) const;
  // `early`: the receive of a Recv action posted ahead of time (null: posted now).
  void execute(const Action& a, std::map<std::pair<int, int>, Slot>& slots, double& loss,
               std::vector<comm::WorkPtr>& sends, Received* early = nullptr);

  ScheduleSpec spec_;
  comm::Communicator* group_;
  int stage_;
  PipelineModel model_;
  std::vector<Action> actions_;
  std::vector<Event> timeline_;
};

}  // namespace crosstrain::parallel
