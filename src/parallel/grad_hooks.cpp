#include "crosstrain/parallel/grad_hooks.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <atomic>

namespace crosstrain::parallel {

struct GradientHooks::State {
  std::function<bool(size_t)> on_ready;
  std::function<void()> on_backward_end;
  std::atomic<bool> alive{true};  // false once the owner is gone: every hook and callback checks it first
  bool in_pass = false;
};

void GradientHooks::gradient_ready(const std::shared_ptr<State>& s, size_t index) {
  if (!s->alive || !s->on_ready(index) || s->in_pass) return;
  s->in_pass = true;
  // The engine runs it when this backward pass is over; the owner may be gone by then.
  torch::autograd::Engine::get_default_engine().queue_callback([s] {
    if (s->alive) s->on_backward_end();
  });
}

GradientHooks::GradientHooks(const std::vector<at::Tensor>& parameters, std::function<bool(size_t)> on_ready,
                             std::function<void()> on_backward_end)
    : state_(std::make_shared<State>()) {
  state_->on_ready = std::move(on_ready);
  state_->on_backward_end = std::move(on_backward_end);
  for (size_t i = 0; i < parameters.size(); ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(parameters[i]);
    acc->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [s = state_, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          gradient_ready(s, i);
          return outputs;
        }));
    accumulators_.push_back(std::move(acc));
  }
}

GradientHooks::~GradientHooks() { state_->alive = false; }

bool GradientHooks::in_pass() const { return state_->in_pass; }

void GradientHooks::begin_pass() { state_->in_pass = true; }

void GradientHooks::end_pass() { state_->in_pass = false; }

void GradientHooks::on_gradient(const at::Tensor& tensor, std::function<void()> fn) const {
  tensor.register_hook([s = state_, fn = std::move(fn)](const at::Tensor&) {
    if (s->alive) fn();
  });
}

}  // namespace crosstrain::parallel
