#include "crosstrain/parallel/tensor_parallel.h"

#include <torch/csrc/autograd/custom_function.h>
#include <ATen/ATen.h>

#include <algorithm>

namespace crosstrain::parallel::tp {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kIgnoreIndex = -100;  // torch's default ignore_index: a target that is not counted

// The group travels through the autograd context as an integer (IValues cannot hold raw pointers).
int64_t handle(comm::Communicator* g) { return reinterpret_cast<int64_t>(g); }
comm::Communicator* group_of(AutogradContext* ctx) {
  return reinterpret_cast<comm::Communicator*>(ctx->saved_data["group"].toInt());
}

at::Tensor all_reduce(const at::Tensor& x, comm::Communicator* g) {
  at::Tensor t = x.contiguous().clone();
  g->all_reduce(t, comm::ReduceOp::Sum)->wait();
  return t;
}

// All-gather along `dim`: move it to the front, gather flat, move it back.
at::Tensor all_gather(const at::Tensor& x, int64_t dim, comm::Communicator* g) {
  at::Tensor front = x.transpose(0, dim).contiguous();
  auto sizes = front.sizes().vec();
  sizes[0] *= g->size();
  at::Tensor out = at::empty(sizes, front.options());
  g->all_gather(front, out)->wait();
  return out.transpose(0, dim).contiguous();
}

at::Tensor reduce_scatter(const at::Tensor& x, int64_t dim, comm::Communicator* g) {
  at::Tensor front = x.transpose(0, dim).contiguous();
  auto sizes = front.sizes().vec();
  TORCH_CHECK(sizes[0] % g->size() == 0, "reduce-scatter: dimension ", dim, " of size ", sizes[0],
              " does not split over ", g->size(), " ranks");
  sizes[0] /= g->size();
  at::Tensor out = at::empty(sizes, front.options());
  g->reduce_scatter(front, out, comm::ReduceOp::Sum)->wait();
  return out.transpose(0, dim).contiguous();
}

at::Tensor slice(const at::Tensor& x, int64_t dim, comm::Communicator* g) {
  TORCH_CHECK(x.size(dim) % g->size() == 0, "dimension ", dim, " of size ", x.size(dim), " does not split over ",
              g->size(), " tensor-parallel ranks");
  return x.chunk(g->size(), dim)[g->rank()].contiguous();
}

struct CopyToRegion : torch::autograd::Function<CopyToRegion> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, int64_t g) {
    ctx->saved_data["group"] = g;
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {all_reduce(grad[0], group_of(ctx)), at::Tensor()};
  }
};

struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, int64_t g) {
    return all_reduce(x, reinterpret_cast<comm::Communicator*>(g));
  }
  static variable_list backward(AutogradContext*, variable_list grad) { return {grad[0], at::Tensor()}; }
};

struct ScatterToRegion : torch::autograd::Function<ScatterToRegion> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, int64_t g) {
    ctx->saved_data["group"] = g;
    return slice(x, x.dim() - 1, reinterpret_cast<comm::Communicator*>(g));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {all_gather(grad[0], grad[0].dim() - 1, group_of(ctx)), at::Tensor()};
  }
};

struct GatherFromRegion : torch::autograd::Function<GatherFromRegion> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, int64_t g) {
    ctx->saved_data["group"] = g;
    return all_gather(x, x.dim() - 1, reinterpret_cast<comm::Communicator*>(g));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {slice(grad[0], grad[0].dim() - 1, group_of(ctx)), at::Tensor()};
  }
};

struct ScatterToSequence : torch::autograd::Function<ScatterToSequence> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, int64_t g) {
    ctx->saved_data["group"] = g;
    return slice(x, 1, reinterpret_cast<comm::Communicator*>(g));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {all_gather(grad[0], 1, group_of(ctx)), at::Tensor()};
  }
};

struct GatherFromSequence : torch::autograd::Function<GatherFromSequence> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, int64_t g) {
    ctx->saved_data["group"] = g;
    return all_gather(x, 1, reinterpret_cast<comm::Communicator*>(g));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {reduce_scatter(grad[0], 1, group_of(ctx)), at::Tensor()};
  }
};

struct ReduceScatterToSequence : torch::autograd::Function<ReduceScatterToSequence> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor x, int64_t g) {
    ctx->saved_data["group"] = g;
    return reduce_scatter(x, 1, reinterpret_cast<comm::Communicator*>(g));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    return {all_gather(grad[0], 1, group_of(ctx)), at::Tensor()};
  }
};

struct VocabParallelCrossEntropy : torch::autograd::Function<VocabParallelCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, at::Tensor logits, at::Tensor targets, int64_t vocab_start,
                            int64_t g) {
    auto* group = reinterpret_cast<comm::Communicator*>(g);
    at::Tensor l = logits.reshape({-1, logits.size(-1)}).to(at::kFloat);
    at::Tensor t = targets.reshape({-1});
    const int64_t local_vocab = l.size(1);
    // Subtract the global max for a stable softmax.
    at::Tensor max = std::get<0>(l.max(1)).contiguous();
    group->all_reduce(max, comm::ReduceOp::Max)->wait();
    at::Tensor shifted = l - max.unsqueeze(1);
    at::Tensor exp = shifted.exp();
    at::Tensor sum = exp.sum(1).contiguous();
    group->all_reduce(sum, comm::ReduceOp::Sum)->wait();
    // The target's logit lives on exactly one rank; the others contribute zero.
    at::Tensor local = t - vocab_start;
    at::Tensor mine = (local >= 0).logical_and(local < local_vocab);
    at::Tensor index = local.clamp(0, local_vocab - 1);
    at::Tensor picked = shifted.gather(1, index.unsqueeze(1)).squeeze(1) * mine.to(shifted.scalar_type());
    picked = picked.contiguous();
    group->all_reduce(picked, comm::ReduceOp::Sum)->wait();
    // Targets of -100 (torch's ignore_index) are not counted: the mean runs over the others (0 when none).
    at::Tensor counted = (t != kIgnoreIndex).to(at::kFloat);
    const double count = std::max(counted.sum().item<double>(), 1.0);
    at::Tensor loss = ((sum.log() - picked) * counted).sum() / count;
    ctx->saved_data["count"] = count;
    ctx->save_for_backward({exp / sum.unsqueeze(1), index, mine, counted});
    ctx->saved_data["shape"] = logits.sizes().vec();
    ctx->saved_data["dtype"] = static_cast<int64_t>(logits.scalar_type());
    return loss;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto saved = ctx->get_saved_variables();
    at::Tensor softmax = saved[0], index = saved[1], mine = saved[2], counted = saved[3];
    const double count = ctx->saved_data["count"].toDouble();
    // d loss / d logits = (softmax - one_hot(target)) / count on counted rows (0 on ignored ones), on this
    // rank's vocabulary slice.
    at::Tensor g = softmax.clone();
    g.scatter_add_(1, index.unsqueeze(1), -mine.to(g.scalar_type()).unsqueeze(1));
    if (count < static_cast<double>(softmax.size(0))) g.mul_(counted.unsqueeze(1));
    g.mul_(grad[0] / count);
    auto shape = ctx->saved_data["shape"].toIntVector();
    auto dtype = static_cast<at::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {g.view(shape).to(dtype), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor copy_to_region(const at::Tensor& x, comm::Communicator* g) {
  return g ? CopyToRegion::apply(x, handle(g)) : x;
}
at::Tensor reduce_from_region(const at::Tensor& x, comm::Communicator* g) {
  return g ? ReduceFromRegion::apply(x, handle(g)) : x;
}
at::Tensor scatter_to_region(const at::Tensor& x, comm::Communicator* g) {
  return g ? ScatterToRegion::apply(x, handle(g)) : x;
}
at::Tensor gather_from_region(const at::Tensor& x, comm::Communicator* g) {
  return g ? GatherFromRegion::apply(x, handle(g)) : x;
}
at::Tensor scatter_to_sequence(const at::Tensor& x, comm::Communicator* g) {
  return g ? ScatterToSequence::apply(x, handle(g)) : x;
}
at::Tensor gather_from_sequence(const at::Tensor& x, comm::Communicator* g) {
  return g ? GatherFromSequence::apply(x, handle(g)) : x;
}
at::Tensor reduce_scatter_to_sequence(const at::Tensor& x, comm::Communicator* g) {
  return g ? ReduceScatterToSequence::apply(x, handle(g)) : x;
}

at::Tensor vocab_parallel_cross_entropy(const at::Tensor& logits, const at::Tensor& targets, int64_t vocab_start,
                                        comm::Communicator* group) {
  // In fp32 whatever the logits' dtype (as the vocabulary-parallel path below): a bf16 loss keeps 3 digits.
  if (!group) {
    // The mean over targets other than -100, as torch's (which is NaN when every target is ignored; 0 here).
    at::Tensor t = targets.reshape({-1});
    const double count = std::max((t != kIgnoreIndex).sum().item<double>(), 1.0);
    return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(at::kFloat), t, {}, at::Reduction::Sum,
                                  kIgnoreIndex) / count;
  }
  return VocabParallelCrossEntropy::apply(logits, targets, vocab_start, handle(group));
}

}  // namespace crosstrain::parallel::tp
