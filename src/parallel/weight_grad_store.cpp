#include "crosstrain/parallel/weight_grad_store.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <string>

#include "crosstrain/core/error.h"

namespace crosstrain::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// [..., n] -> [rows, n]: the weight gradient is one product over every token of the micro-batch.
at::Tensor rows(const at::Tensor& t) { return t.reshape({-1, t.size(-1)}); }

struct LinearWithStore : public torch::autograd::Function<LinearWithStore> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const c10::optional<at::Tensor>& bias, WeightGradStore* store) {
    const bool has_bias = bias.has_value() && bias->defined();
    ctx->save_for_backward({x, weight, has_bias ? *bias : at::Tensor()});
    ctx->saved_data["has_bias"] = has_bias;
    ctx->saved_data["store"] = reinterpret_cast<int64_t>(store);
    // at::linear folds a 3-D input into one addmm, as the plain layer does.
    return at::linear(x, weight, bias.has_value() ? *bias : at::Tensor());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &bias = saved[2];
    const at::Tensor dy = grads[0].contiguous();
    const bool has_bias = ctx->saved_data["has_bias"].toBool();
    auto* store = reinterpret_cast<WeightGradStore*>(ctx->saved_data["store"].toInt());
    at::Tensor dx = ctx->needs_input_grad(0) ? at::matmul(dy, weight) : at::Tensor();
    // A frozen weight (fine-tuning) asks for no gradient: none is computed or deferred.
    const bool want_w = ctx->needs_input_grad(1), want_b = has_bias && ctx->needs_input_grad(2);
    if (!want_w && !want_b) return {dx, at::Tensor(), at::Tensor(), at::Tensor()};
    if (store && store->capturing()) {
      // The parameters are the tensors the node was built with: the store accumulates into their .grad.
      store->defer(weight, want_b ? bias : at::Tensor(), x, dy);
      return {dx, at::Tensor(), at::Tensor(), at::Tensor()};
    }
    at::Tensor dw = want_w ? rows(dy).t().mm(rows(x)) : at::Tensor();
    at::Tensor db = want_b ? rows(dy).sum(0) : at::Tensor();
    return {dx, dw, db, at::Tensor()};
  }
};

}  // namespace

void WeightGradStore::begin_capture(Key key) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (capturing_)
    throw Error("weight-gradient store: capture of micro-batch " + std::to_string(key.first) + " chunk " +
                std::to_string(key.second) + " begun inside the capture of micro-batch " +
                std::to_string(current_.first) + " chunk " + std::to_string(current_.second));
  capturing_ = true;
  current_ = key;
  kept_[key];  // an entry even when the backward defers nothing (a stage of no linear layers)
}

void WeightGradStore::end_capture() {
  std::lock_guard<std::mutex> lock(mutex_);
  capturing_ = false;
}

bool WeightGradStore::capturing() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return capturing_;
}

void WeightGradStore::defer(const at::Tensor& weight, const at::Tensor& bias, at::Tensor input, at::Tensor output_grad) {
  std::lock_guard<std::mutex> lock(mutex_);
  kept_[current_].push_back({weight, bias, std::move(input), std::move(output_grad)});
}

int WeightGradStore::apply(Key key) {
  std::vector<Deferred> entries;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = kept_.find(key);
    if (it == kept_.end())
      throw Error("weight-gradient store: no input-gradient pass of micro-batch " + std::to_string(key.first) +
                  " chunk " + std::to_string(key.second) + " to take weight gradients from (schedule out of order?)");
    entries = std::move(it->second);
    kept_.erase(it);
  }
  if (entries.empty()) return 0;
  // One backward over the leaves themselves: each product lands in .grad through the parameter's own
  // accumulator, firing the hooks that reducers hang there.
  variable_list leaves, grads;
  for (const Deferred& d : entries) {
    leaves.push_back(d.weight);
    grads.push_back(rows(d.output_grad).t().mm(rows(d.input)));
    if (d.bias.defined()) {
      leaves.push_back(d.bias);
      grads.push_back(rows(d.output_grad).sum(0));
    }
  }
  torch::autograd::backward(leaves, grads);
  return static_cast<int>(entries.size());
}

size_t WeightGradStore::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  size_t n = 0;
  for (const auto& [key, entries] : kept_) n += entries.size();
  return n;
}

void WeightGradStore::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  kept_.clear();
  capturing_ = false;
}

at::Tensor linear_with_store(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                             WeightGradStore* store) {
  if (!store) return at::linear(x, weight, bias);
  return LinearWithStore::apply(x, weight, bias.defined() ? c10::optional<at::Tensor>(bias) : c10::nullopt, store);
}

}  // namespace crosstrain::parallel
