#include "crosstrain/parallel/pipeline.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>

#include "crosstrain/core/error.h"

namespace crosstrain::parallel {
namespace {
using Clock = std::chrono::steady_clock;
}

PipelineRuntime::PipelineRuntime(ScheduleSpec spec, comm::Communicator* group, int stage, PipelineModel model)
    : spec_(spec), group_(group), stage_(stage), model_(std::move(model)) {
  auto all = build_schedule(spec_);
  std::string problem = check_schedule(spec_, all);
  if (!problem.empty()) throw Error("pipeline schedule " + std::string(to_string(spec_.kind)) + " is invalid: " + problem);
  actions_ = all.at(static_cast<size_t>(stage_));
  if (spec_.stages > 1 && (!group_ || group_->size() != spec_.stages))
    throw Error("the pipeline needs a group of " + std::to_string(spec_.stages) + " stages");
}

bool PipelineRuntime::holds_last_stage() const { return stage_ == spec_.stages - 1; }

// The loss (last virtual stage) starts its own backward; other outputs take the received gradient.
torch::autograd::variable_list PipelineRuntime::output_grads(const Slot& s, bool last) {
  return last ? torch::autograd::variable_list{} : torch::autograd::variable_list{s.output_grad};
}

void PipelineRuntime::run_backward(Slot& s, bool last) {
  torch::autograd::backward({s.output}, output_grads(s, last));
  if (s.input.defined()) s.input_grad = s.input.grad();
  s.output = at::Tensor();  // free the stage's graph
}

int PipelineRuntime::tag(ActionType kind, int mb, int vs) const {
  // One tag per (direction, receiving virtual stage, micro-batch): messages cannot be confused.
  const int direction = kind == ActionType::SendActivation || kind == ActionType::RecvActivation ? 0 : 1;
  return (direction * spec_.stages * spec_.chunks + vs) * spec_.microbatches + mb;
}

PipelineRuntime::Received PipelineRuntime::post_receive(const Action& a) const {
  const Peer peer = peer_of(spec_, stage_, a);
  const int vs = virtual_stage(spec_, stage_, a.chunk);
  Received r;
  r.buffer = at::empty(model_.activation_shape, at::TensorOptions().dtype(model_.activation_dtype));
  r.work = group_->recv(r.buffer, peer.rank, tag(a.type, a.microbatch, vs));
  return r;
}

void PipelineRuntime::execute(const Action& a, std::map<std::pair<int, int>, Slot>& slots, double& loss,
                              std::vector<comm::WorkPtr>& sends, Received* early) {
  Slot& s = slots[{a.microbatch, a.chunk}];
  const int vs = virtual_stage(spec_, stage_, a.chunk);
  const bool last = vs == spec_.stages * spec_.chunks - 1;
  switch (a.type) {
    case ActionType::RecvActivation: {
      Received r = early ? std::move(*early) : post_receive(a);
      r.work->wait();
      s.input = r.buffer.requires_grad_(true);
      break;
    }
    case ActionType::Forward: {
      s.output = model_.forward(a.chunk, a.microbatch, s.input);
      if (last) loss += s.output.item<double>();
      break;
    }
    case ActionType::SendActivation: {
      Peer peer = peer_of(spec_, stage_, a);
      at::Tensor out = s.output.detach().contiguous();
      sends.push_back(group_->send(out, peer.rank, tag(a.type, a.microbatch, vs + 1)));
      break;
    }
    case ActionType::RecvGrad: {
      Received r = early ? std::move(*early) : post_receive(a);
      r.work->wait();
      s.output_grad = r.buffer;
      break;
    }
    case ActionType::Backward: {
      run_backward(s, last);
      break;
    }
    case ActionType::BackwardInput: {
      if (model_.weight_grads) {
        // One backward: input and small parameters' gradients now, the linear layers' weight gradients kept.
        model_.weight_grads->begin_capture({a.microbatch, a.chunk});
        try {
          run_backward(s, last);
        } catch (...) {
          model_.weight_grads->end_capture();
          throw;
        }
        model_.weight_grads->end_capture();
      } else if (s.input.defined()) {
        // Input gradient only; the graph is kept for the weight pass.
        auto grads = torch::autograd::grad({s.output}, {s.input}, output_grads(s, last), /*retain_graph=*/true);
        s.input_grad = grads[0];
      }
      break;
    }
    case ActionType::BackwardWeight: {
      if (model_.weight_grads) {
        model_.weight_grads->apply({a.microbatch, a.chunk});
      } else {
        torch::autograd::backward({s.output}, output_grads(s, last), /*retain_graph=*/false, /*create_graph=*/false,
                                  model_.parameters(a.chunk));
        s.output = at::Tensor();
      }
      break;
    }
    case ActionType::SendGrad: {
      Peer peer = peer_of(spec_, stage_, a);
      at::Tensor g = s.input_grad.contiguous();
      sends.push_back(group_->send(g, peer.rank, tag(a.type, a.microbatch, vs - 1)));
      break;
    }
  }
}

double PipelineRuntime::train_step() {
  std::map<std::pair<int, int>, Slot> slots;
  std::vector<comm::WorkPtr> sends;
  double loss = 0;
  timeline_.clear();
  if (model_.weight_grads) model_.weight_grads->clear();  // nothing kept from a step that failed
  const auto start = Clock::now();
  auto since = [&](Clock::time_point t) { return std::chrono::duration<double>(t - start).count(); };
  // Receives are posted up to kReceiveLookahead actions ahead, in list order (so per peer in the order the
  // schedule checked): the transfer runs during the computations before the one that needs it, instead of
  // starting when the stage asks for it. Few enough that the buffers stay a handful of activations.
  constexpr size_t kReceiveLookahead = 6;
  std::map<size_t, Received> early;
  size_t next_to_post = 0;
  for (size_t i = 0; i < actions_.size(); ++i) {
    for (; next_to_post < actions_.size() && next_to_post <= i + kReceiveLookahead; ++next_to_post) {
      const ActionType t = actions_[next_to_post].type;
      if (t == ActionType::RecvActivation || t == ActionType::RecvGrad)
        early[next_to_post] = post_receive(actions_[next_to_post]);
    }
    const Action& a = actions_[i];
    auto posted = early.find(i);
    const auto t0 = Clock::now();
    execute(a, slots, loss, sends, posted == early.end() ? nullptr : &posted->second);
    timeline_.push_back({a, since(t0), since(Clock::now())});
    if (posted != early.end()) early.erase(posted);
  }
  comm::wait_all(sends);
  return loss;
}

double PipelineRuntime::eval_step() {
  at::NoGradGuard no_grad;
  std::map<std::pair<int, int>, Slot> slots;
  std::vector<comm::WorkPtr> sends;
  double loss = 0;
  // Forward actions of a GPipe schedule over the same stages and chunks, in virtual-stage order.
  for (int chunk = 0; chunk < spec_.chunks; ++chunk)
    for (int mb = 0; mb < spec_.microbatches; ++mb) {
      const int vs = virtual_stage(spec_, stage_, chunk);
      if (vs > 0) execute({ActionType::RecvActivation, mb, chunk}, slots, loss, sends);
      execute({ActionType::Forward, mb, chunk}, slots, loss, sends);
      if (vs < spec_.stages * spec_.chunks - 1) execute({ActionType::SendActivation, mb, chunk}, slots, loss, sends);
      slots.erase({mb, chunk});
    }
  comm::wait_all(sends);
  return loss;
}

}  // namespace crosstrain::parallel
