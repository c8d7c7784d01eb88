#include "crosstrain/models/recompute.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <mutex>

#include "crosstrain/core/error.h"

namespace crosstrain::models {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Fn = std::function<at::Tensor(const at::Tensor&)>;

// What the backward needs besides the saved input: the region and the random state it first ran with.
struct Region : torch::CustomClassHolder {
  Fn fn;
  std::vector<at::Tensor> parameters;  // the leaves fn reads: their gradients are asked for by identity
  c10::intrusive_ptr<c10::TensorImpl> rng_state;
};

at::Generator& default_generator() {
  static at::Generator gen = at::detail::getDefaultCPUGenerator();
  return gen;
}

at::Tensor generator_state() {
  at::Generator& gen = default_generator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return at::Tensor(gen.get_state());
}

void set_generator_state(const at::Tensor& state) {
  at::Generator& gen = default_generator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

struct RecomputeFunction : public torch::autograd::Function<RecomputeFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, at::TensorList parameters,
                            c10::intrusive_ptr<Region> region) {
    region->rng_state = generator_state().getIntrusivePtr();
    ctx->save_for_backward({x});
    ctx->saved_data["region"] = c10::IValue::make_capsule(region);
    return region->fn(x);  // gradient mode is off here: nothing inside is saved
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto region = c10::static_intrusive_pointer_cast<Region>(ctx->saved_data["region"].toCapsule());
    const at::Tensor x = ctx->get_saved_variables()[0];
    at::Tensor input = x.detach().requires_grad_(x.requires_grad());
    const at::Tensor now = generator_state();
    set_generator_state(at::Tensor(region->rng_state));
    at::Tensor out;
    {
      at::AutoGradMode enable(true);
      out = region->fn(input);
    }
    set_generator_state(now);
    variable_list wrt;
    if (input.requires_grad()) wrt.push_back(input);
    for (const at::Tensor& p : region->parameters) wrt.push_back(p);
    variable_list got = wrt.empty() ? variable_list{}
                                    : torch::autograd::grad({out}, wrt, {grads[0]}, /*retain_graph=*/false,
                                                            /*create_graph=*/false, /*allow_unused=*/true);
    variable_list result;
    size_t k = 0;
    result.push_back(input.requires_grad() ? got[k++] : at::Tensor());
    for (size_t i = 0; i < region->parameters.size(); ++i) result.push_back(got[k++]);
    result.push_back(at::Tensor());  // the region
    return result;
  }
};

}  // namespace

Recompute parse_recompute(const std::string& name) {
  if (name == "none") return Recompute::None;
  if (name == "selective") return Recompute::Selective;
  if (name == "full") return Recompute::Full;
  throw UsageError("train.recompute = '" + name + "': use \"none\", \"selective\" (the attention core) or \"full\" "
                   "(whole blocks)");
}

const char* to_string(Recompute r) {
  switch (r) {
    case Recompute::None: return "none";
    case Recompute::Selective: return "selective";
    case Recompute::Full: return "full";
  }
  return "?";
}

at::Tensor recomputed(const Fn& fn, const at::Tensor& x, const std::vector<at::Tensor>& parameters) {
  if (!at::GradMode::is_enabled()) return fn(x);
  auto region = c10::make_intrusive<Region>();
  region->fn = fn;
  for (const at::Tensor& p : parameters)
    if (p.requires_grad()) region->parameters.push_back(p);  // frozen ones get no gradient
  return RecomputeFunction::apply(x, at::TensorList(region->parameters), region);
}

}  // namespace crosstrain::models
