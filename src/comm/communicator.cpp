#include "crosstrain/comm/communicator.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <set>
#include <sstream>

#include "crosstrain/comm/reference.h"

namespace crosstrain::comm {

const char* to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Avg: return "avg";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
    case ReduceOp::Product: return "prod";
  }
  return "?";
}

ReduceOp parse_reduce_op(const std::string& name) {
  if (name == "sum") return ReduceOp::Sum;
  if (name == "avg" || name == "mean") return ReduceOp::Avg;
  if (name == "min") return ReduceOp::Min;
  if (name == "max") return ReduceOp::Max;
  if (name == "prod" || name == "product") return ReduceOp::Product;
  throw UsageError("unknown reduction '" + name + "'; use one of sum, avg, min, max, prod");
}

namespace {
class CompletedWork : public Work {
 public:
  CompletedWork() : Work(Millis(0)) {}
  void wait(Millis) override {}
  bool is_completed() override { return true; }
};
}  // namespace

WorkPtr completed_work() { return std::make_shared<CompletedWork>(); }

void wait_all(const std::vector<WorkPtr>& works) {
  for (const auto& w : works)
    if (w) w->wait();
}

double max_over_ranks(Communicator& c, double value) {
  at::Tensor t = at::full({1}, value, at::kDouble);
  c.all_reduce(t, ReduceOp::Max)->wait();
  return t.item<double>();
}

CommContext Communicator::context(const std::string& op, int peer) const {
  CommContext c;
  c.rank = rank_;
  c.op = op;
  c.group = name_;
  c.group_size = size_;
  c.peer = peer;
  c.step = step_;
  return c;
}

void Communicator::fail(const std::string& op, const std::string& cause, int peer) const {
  throw CommError(context(op, peer), cause);
}

void Communicator::check_tensor(const std::string& op, const at::Tensor& t, const char* what) const {
  if (!t.defined()) fail(op, std::string(what) + " tensor is undefined");
  if (!t.is_contiguous()) fail(op, std::string(what) + " tensor must be contiguous (call .contiguous())");
  if (!t.device().is_cpu() && backend_ != "nccl")
    fail(op, std::string(what) + " tensor is on " + t.device().str() + " but the " + backend_ +
                 " back end needs CPU tensors");
}

void Communicator::check_root(const std::string& op, int root) const {
  if (root < 0 || root >= size_)
    fail(op, "root " + std::to_string(root) + " is outside 0.." + std::to_string(size_ - 1));
}

void Communicator::check_peer(const std::string& op, int peer) const {
  if (peer < 0 || peer >= size_)
    fail(op, "peer " + std::to_string(peer) + " is outside 0.." + std::to_string(size_ - 1));
  if (peer == rank_) fail(op, "a rank cannot send to or receive from itself", peer);
}

void Communicator::check_same_dtype(const std::string& op, const at::Tensor& a, const at::Tensor& b) const {
  if (a.scalar_type() != b.scalar_type())
    fail(op, std::string("input is ") + c10::toString(a.scalar_type()) + " but output is " +
                 c10::toString(b.scalar_type()));
}

void Communicator::check_sliced(const std::string& op, const at::Tensor& one, const at::Tensor& many) const {
  if (many.numel() != one.numel() * size_)
    fail(op, "the per-rank buffer has " + std::to_string(one.numel()) + " elements, so the full buffer needs " +
                 std::to_string(one.numel() * size_) + " (" + std::to_string(size_) + " ranks), not " +
                 std::to_string(many.numel()));
}

void Communicator::check_equal_numel(const std::string& op, const at::Tensor& a, const at::Tensor& b) const {
  if (a.numel() != b.numel())
    fail(op, "input has " + std::to_string(a.numel()) + " elements but output has " + std::to_string(b.numel()));
}

void Communicator::check_all_to_all(const at::Tensor& input, const at::Tensor& output) const {
  check_tensor("alltoall", input, "input");
  check_tensor("alltoall", output, "output");
  check_same_dtype("alltoall", input, output);
  check_equal_numel("alltoall", input, output);
  if (input.numel() % size_ != 0)
    fail("alltoall", "buffer of " + std::to_string(input.numel()) + " elements does not split into " +
                         std::to_string(size_) + " equal slices");
}

void Communicator::check_split_ranks(const std::vector<int>& ranks) const {
  if (ranks.empty()) fail("split", "the list of ranks is empty");
  std::set<int> seen;
  for (int r : ranks) {
    if (r < 0 || r >= size_)
      fail("split", "rank " + std::to_string(r) + " is outside 0.." + std::to_string(size_ - 1));
    if (!seen.insert(r).second) fail("split", "rank " + std::to_string(r) + " is listed twice");
  }
}

std::string Communicator::next_split_name() {
  return name_ + ".g" + std::to_string(splits_++);
}

at::Tensor reduce_reference(const std::vector<at::Tensor>& inputs, ReduceOp op) {
  if (inputs.empty()) throw UsageError("reduce_reference: no inputs");
  const auto dtype = inputs[0].scalar_type();
  const bool is_bool = dtype == at::kBool;
  const bool is_complex = at::isComplexType(dtype);
  if (is_bool && op == ReduceOp::Avg) throw UsageError("avg is not defined for bool tensors; use sum (or) or min");
  // Gloo reduces complex numbers as pairs of reals, which only sum: keep every back end to the same set.
  if (is_complex && op != ReduceOp::Sum && op != ReduceOp::Avg)
    throw UsageError(std::string(to_string(op)) + " is not supported for complex tensors (only sum and avg)");
  at::Tensor acc = inputs[0].clone();
  for (size_t i = 1; i < inputs.size(); ++i) {
    const at::Tensor& x = inputs[i];
    switch (op) {
      case ReduceOp::Sum:
      case ReduceOp::Avg:
        if (is_bool) acc = at::logical_or(acc, x);
        else acc.add_(x);
        break;
      case ReduceOp::Product:
        if (is_bool) acc = at::logical_and(acc, x);
        else acc.mul_(x);
        break;
      case ReduceOp::Min: acc = at::minimum(acc, x); break;
      case ReduceOp::Max: acc = at::maximum(acc, x); break;
    }
  }
  if (op == ReduceOp::Avg) {
    const auto n = static_cast<int64_t>(inputs.size());
    if (at::isFloatingType(dtype) || is_complex) acc.div_(n);
    else acc = at::div(acc, n, "trunc").to(dtype);
  }
  return acc;
}

}  // namespace crosstrain::comm
