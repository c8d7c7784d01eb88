// Gloo back end: c10d's ProcessGroupGloo behind the Communicator interface.
//
// Gloo handles float, double, half, int8, uint8, int32 and int64 natively. Other dtypes are moved as raw
// bytes (broadcast, gathers, scatter, all-to-all, send/recv) or reduced in a wider type and copied back
// (bfloat16 via float, int16 via int32, bool as uint8 with max/min for or/and, complex as pairs of reals).
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "crosstrain/comm/init.h"
#include "crosstrain/comm/backends/group_formation_store.h"

namespace crosstrain::comm {
namespace {

bool gloo_native(at::ScalarType t) {
  switch (t) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kChar: case at::kByte: case at::kInt:
    case at::kLong:
      return true;
    default:
      return false;
  }
}

// A view of `t` that Gloo can move byte for byte.
at::Tensor as_bytes(const at::Tensor& t) {
  if (gloo_native(t.scalar_type())) return t;
  return t.reshape({-1}).view(at::kByte);
}

std::string first_line(const std::string& text) {
  auto end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

class GlooCommunicator;

// Wraps a c10d work item; runs `finish` (copy back, divide for avg, ...) once, after success.
class GlooWork : public Work {
 public:
  GlooWork(GlooCommunicator* comm, std::string op, int peer, c10::intrusive_ptr<c10d::Work> work,
           std::function<void()> finish);
  void wait(Millis timeout) override;
  bool is_completed() override { return done_ || work_->isCompleted(); }
  std::optional<bool> wait_unless(Millis timeout, const std::function<bool()>& give_up) override;

 private:
  GlooCommunicator* comm_;
  std::string op_;
  int peer_;
  c10::intrusive_ptr<c10d::Work> work_;
  std::function<void()> finish_;
  bool done_ = false;
};

// A reduction plan: the buffer Gloo reduces, the Gloo op, and what to do afterwards.
struct Reduction {
  at::Tensor buffer;
  c10d::ReduceOp op;
  std::function<void()> finish;
};

// Forms the group on a helper thread while this one watches `abandoned`: after the addresses are exchanged over
// the store (whose waits the caller makes abandonable), Gloo connects to each peer over TCP and waits for a dead
// one until its timeout, where nothing can reach it. Given up on, the helper finishes (or fails) by itself and
// drops what it made.
c10::intrusive_ptr<c10d::ProcessGroupGloo> form_unless_abandoned(c10::intrusive_ptr<c10d::Store> store, int rank,
                                                                  int size,
                                                                  c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> options,
                                                                  const std::function<bool()>& abandoned) {
  struct Forming {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false, given_up = false;
    c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
    std::exception_ptr error;
  };
  auto forming = std::make_shared<Forming>();
  std::thread([forming, store, rank, size, options] {
    c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
    std::exception_ptr error;
    try {
      group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
    } catch (...) {
      error = std::current_exception();
    }
    std::unique_lock<std::mutex> lock(forming->mu);
    if (forming->given_up) return;  // `group` (if any) is dropped here, on this thread
    forming->group = std::move(group);
    forming->error = error;
    forming->done = true;
    forming->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(forming->mu);
  while (!forming->cv.wait_for(lock, Millis(20), [&] { return forming->done; }))
    if (abandoned()) {
      forming->given_up = true;
      CommContext c;
      c.op = "init";
      throw CommError(c, "the group was given up before it formed");
    }
  if (forming->error) std::rethrow_exception(forming->error);
  return forming->group;
}

class GlooCommunicator : public Communicator {
 public:
  // The group forms over `base` (the job's store) under `prefix`, where its subgroups' keys go too.
  GlooCommunicator(std::shared_ptr<Rendezvous> rendezvous, c10::intrusive_ptr<c10d::Store> base, std::string prefix,
                   std::string name, int rank, int size, Millis timeout, std::function<bool()> abandoned = {})
      : Communicator("gloo", std::move(name), rank, size, timeout), rendezvous_(std::move(rendezvous)),
        base_(std::move(base)), prefix_(std::move(prefix)),
        store_(c10::make_intrusive<GroupFormationStore>(base_, prefix_, rank, size, abandoned, this->name())),
        abandoned_(std::move(abandoned)) {
    auto options = c10d::ProcessGroupGloo::Options::create(timeout);
    options->devices.push_back(make_device());
    // One worker thread: on small machines more threads only add contention and wake-up latency.
    options->threads = 1;
    try {
      pg_ = abandoned_ ? form_unless_abandoned(store_, rank, size, options, abandoned_)
                      : c10::make_intrusive<c10d::ProcessGroupGloo>(store_, rank, size, options);
    } catch (const CommError& e) {
      // The store's own error already names the address, the key and the cause: pass its cause on once.
      CommContext c = context("init");
      if (e.timed_out()) c.timeout = timeout;
      throw CommError(c, e.cause(), e.timed_out());
    } catch (const std::exception& e) {
      CommContext c = context("init");
      c.timeout = timeout;
      throw CommError(c, "could not connect to all " + std::to_string(size) + " ranks of the group through the " +
                             "rendezvous store at " + rendezvous_->address() + ":" +
                             std::to_string(rendezvous_->port()) + " (is that address really rank 0's store?): " +
                             first_line(e.what()));
    }
  }

  ~GlooCommunicator() override {
    // A failed group may still have Gloo threads blocked in an operation; destroying it would wait for them. Right
    // after the failure (the process is going down with the error) it is leaked rather than waited for; once the
    // group's timeout has passed (an elastic generation retired that long ago) every operation has ended and it
    // is released like any other.
    if (broken_ && std::chrono::steady_clock::now() - broken_at_ < timeout() + std::chrono::seconds(1))
      (void)pg_.release();
  }

  void mark_broken() {
    broken_ = true;
    broken_at_ = std::chrono::steady_clock::now();
  }
  CommContext context_for(const std::string& op, int peer) const { return context(op, peer); }

  WorkPtr broadcast(at::Tensor& tensor, int root) override {
    check_tensor("broadcast", tensor, "the");
    check_root("broadcast", root);
    if (tensor.numel() == 0) return done();
    std::vector<at::Tensor> tensors{as_bytes(tensor)};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.timeout = timeout();
    return start("broadcast", root, [&] { return pg_->broadcast(tensors, opts); });
  }

  WorkPtr reduce(at::Tensor& tensor, int root, ReduceOp op) override {
    const std::string name = std::string("reduce(") + to_string(op) + ")";
    check_tensor(name, tensor, "the");
    check_root(name, root);
    if (tensor.numel() == 0) return done();
    Reduction plan = plan_reduction(name, tensor, op, rank() == root);
    std::vector<at::Tensor> tensors{plan.buffer};
    c10d::ReduceOptions opts;
    opts.reduceOp = plan.op;
    opts.rootRank = root;
    opts.timeout = timeout();
    return start(name, root, [&] { return pg_->reduce(tensors, opts); }, plan.finish);
  }

  WorkPtr all_reduce(at::Tensor& tensor, ReduceOp op) override {
    const std::string name = std::string("allreduce(") + to_string(op) + ")";
    check_tensor(name, tensor, "the");
    if (tensor.numel() == 0) return done();
    Reduction plan = plan_reduction(name, tensor, op, true);
    std::vector<at::Tensor> tensors{plan.buffer};
    c10d::AllreduceOptions opts;
    opts.reduceOp = plan.op;
    opts.timeout = timeout();
    return start(name, -1, [&] { return pg_->allreduce(tensors, opts); }, plan.finish);
  }

  WorkPtr gather(const at::Tensor& input, at::Tensor& output, int root) override {
    check_tensor("gather", input, "input");
    check_root("gather", root);
    const bool is_root = rank() == root;
    if (is_root) {
      check_tensor("gather", output, "output");
      check_same_dtype("gather", input, output);
      check_sliced("gather", input, output);
    }
    if (input.numel() == 0) return done();
    std::vector<at::Tensor> inputs{as_bytes(input)};
    std::vector<std::vector<at::Tensor>> outputs;
    if (is_root) outputs.push_back(slices(as_bytes(output), inputs[0]));
    c10d::GatherOptions opts;
    opts.rootRank = root;
    opts.timeout = timeout();
    return start("gather", root, [&] { return pg_->gather(outputs, inputs, opts); });
  }

  WorkPtr all_gather(const at::Tensor& input, at::Tensor& output) override {
    check_tensor("allgather", input, "input");
    check_tensor("allgather", output, "output");
    check_same_dtype("allgather", input, output);
    check_sliced("allgather", input, output);
    if (input.numel() == 0) return done();
    std::vector<at::Tensor> inputs{as_bytes(input)};
    std::vector<std::vector<at::Tensor>> outputs{slices(as_bytes(output), inputs[0])};
    c10d::AllgatherOptions opts;
    opts.timeout = timeout();
    return start("allgather", -1, [&] { return pg_->allgather(outputs, inputs, opts); });
  }

  WorkPtr scatter(const at::Tensor& input, at::Tensor& output, int root) override {
    check_tensor("scatter", output, "output");
    check_root("scatter", root);
    const bool is_root = rank() == root;
    if (is_root) {
      check_tensor("scatter", input, "input");
      check_same_dtype("scatter", input, output);
      check_sliced("scatter", output, input);
    }
    if (output.numel() == 0) return done();
    std::vector<at::Tensor> outputs{as_bytes(output)};
    std::vector<std::vector<at::Tensor>> inputs;
    if (is_root) inputs.push_back(slices(as_bytes(input), outputs[0]));
    c10d::ScatterOptions opts;
    opts.rootRank = root;
    opts.timeout = timeout();
    return start("scatter", root, [&] { return pg_->scatter(outputs, inputs, opts); });
  }

  // Gloo's process group has no reduce-scatter: all-reduce a copy and keep this rank's slice.
  // Twice the optimal traffic; the algorithms of our own replace it.
  WorkPtr reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override {
    const std::string name = std::string("reducescatter(") + to_string(op) + ")";
    check_tensor(name, input, "input");
    check_tensor(name, output, "output");
    check_same_dtype(name, input, output);
    check_sliced(name, output, input);
    if (output.numel() == 0) return done();
    at::Tensor full = input.clone();
    Reduction plan = plan_reduction(name, full, op, true);
    std::vector<at::Tensor> tensors{plan.buffer};
    c10d::AllreduceOptions opts;
    opts.reduceOp = plan.op;
    opts.timeout = timeout();
    at::Tensor out = output;
    const int me = rank();
    const int n = size();
    auto finish = [full, out, me, n, then = plan.finish]() mutable {
      if (then) then();
      out.copy_(full.view({n, -1})[me].view_as(out));
    };
    return start(name, -1, [&] { return pg_->allreduce(tensors, opts); }, finish);
  }

  WorkPtr all_to_all(const at::Tensor& input, at::Tensor& output) override {
    check_all_to_all(input, output);
    if (input.numel() == 0) return done();
    at::Tensor in = as_bytes(input).view({size(), -1});
    at::Tensor out = as_bytes(output).view({size(), -1});
    std::vector<int64_t> counts;
    c10d::AllToAllOptions opts;
    opts.timeout = timeout();
    return start("alltoall", -1, [&] { return pg_->alltoall_base(out, in, counts, counts, opts); });
  }

  WorkPtr barrier() override {
    c10d::BarrierOptions opts;
    opts.timeout = timeout();
    return start("barrier", -1, [&] { return pg_->barrier(opts); });
  }

  WorkPtr send(const at::Tensor& tensor, int dst, int tag) override {
    const std::string name = "send(tag " + std::to_string(tag) + ")";
    check_tensor(name, tensor, "the");
    check_peer(name, dst);
    check_tag(name, tag);
    std::vector<at::Tensor> tensors{as_bytes(tensor)};
    return start(name, dst, [&] { return pg_->send(tensors, dst, tag); });
  }

  WorkPtr recv(at::Tensor& tensor, int src, int tag) override {
    const std::string name = "recv(tag " + std::to_string(tag) + ")";
    check_tensor(name, tensor, "the");
    check_peer(name, src);
    check_tag(name, tag);
    std::vector<at::Tensor> tensors{as_bytes(tensor)};
    return start(name, src, [&] { return pg_->recv(tensors, src, tag); });
  }

  std::unique_ptr<Communicator> split(const std::vector<int>& ranks) override {
    check_split_ranks(ranks);
    std::string sub = next_split_name();
    auto it = std::find(ranks.begin(), ranks.end(), rank());
    if (it == ranks.end()) return nullptr;
    // A subgroup of a group that can be given up can be too.
    return std::make_unique<GlooCommunicator>(rendezvous_, base_, prefix_ + sub + "/", sub,
                                              static_cast<int>(it - ranks.begin()), static_cast<int>(ranks.size()),
                                              timeout(), abandoned_);
  }

 private:
  std::shared_ptr<::gloo::transport::Device> make_device() {
    // GLOO_SOCKET_IFNAME picks the interface, as in PyTorch; loopback jobs stay on loopback.
    if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME"); ifname && *ifname)
      return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
    const std::string& master = rendezvous_->address();
    if (master.rfind("127.", 0) == 0 || master == "localhost" || master == "::1")
      return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
    return c10d::ProcessGroupGloo::createDefaultDevice();
  }

  void check_tag(const std::string& op, int tag) const {
    if (tag < 0) fail(op, "tags must be non-negative, got " + std::to_string(tag));
  }

  static WorkPtr done() { return completed_work(); }

  // One slice per rank of a sliced buffer, each shaped like `one` (the process group checks shapes).
  std::vector<at::Tensor> slices(const at::Tensor& many, const at::Tensor& one) const {
    at::Tensor rows = many.reshape({size(), -1});
    std::vector<at::Tensor> out;
    for (int r = 0; r < size(); ++r) out.push_back(rows[r].view(one.sizes()));
    return out;
  }

  template <typename Start>
  WorkPtr start(const std::string& op, int peer, Start&& launch, std::function<void()> finish = {}) {
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = launch();
    } catch (const c10::Error& e) {
      mark_broken();
      fail(op, first_line(e.what_without_backtrace()), peer);
    } catch (const std::exception& e) {
      mark_broken();
      fail(op, first_line(e.what()), peer);
    }
    return std::make_shared<GlooWork>(this, op, peer, work, std::move(finish));
  }

  Reduction plan_reduction(const std::string& op, at::Tensor& tensor, ReduceOp reduce_op, bool gets_result) {
    const auto dtype = tensor.scalar_type();
    Reduction plan;
    plan.op = c10d::ReduceOp::SUM;
    switch (reduce_op) {
      case ReduceOp::Sum: case ReduceOp::Avg: plan.op = c10d::ReduceOp::SUM; break;
      case ReduceOp::Min: plan.op = c10d::ReduceOp::MIN; break;
      case ReduceOp::Max: plan.op = c10d::ReduceOp::MAX; break;
      case ReduceOp::Product: plan.op = c10d::ReduceOp::PRODUCT; break;
    }
    if (dtype == at::kBool) {
      if (reduce_op == ReduceOp::Avg) fail(op, "avg is not defined for bool tensors; use sum (or) or min");
      // or = max, and = min over 0/1 bytes.
      if (reduce_op == ReduceOp::Sum) plan.op = c10d::ReduceOp::MAX;
      if (reduce_op == ReduceOp::Product) plan.op = c10d::ReduceOp::MIN;
      plan.buffer = tensor.view(at::kByte);
      return plan;
    }
    at::Tensor buffer = tensor;
    if (at::isComplexType(dtype)) {
      if (reduce_op != ReduceOp::Sum && reduce_op != ReduceOp::Avg)
        fail(op, std::string(to_string(reduce_op)) + " is not supported for complex tensors (only sum and avg)");
      buffer = at::view_as_real(tensor);
    } else if (dtype == at::kBFloat16) {
      buffer = tensor.to(at::kFloat);
    } else if (dtype == at::kShort) {
      buffer = tensor.to(at::kInt);
    } else if (!gloo_native(dtype)) {
      fail(op, std::string("dtype ") + c10::toString(dtype) + " cannot be reduced by the gloo back end");
    }
    plan.buffer = buffer;
    const bool copy_back = !buffer.is_same(tensor) && !at::isComplexType(dtype);
    const int64_t n = size();
    const bool avg = reduce_op == ReduceOp::Avg;
    if (gets_result && (copy_back || avg)) {
      at::Tensor out = tensor;
      const bool floating = at::isFloatingType(buffer.scalar_type());
      plan.finish = [out, buffer, copy_back, avg, floating, n]() mutable {
        // In place: `buffer` is the caller's tensor (or a real view of it) unless it is a widened copy.
        if (avg) {
          if (floating) buffer.div_(n);
          else buffer.copy_(at::div(buffer, n, "trunc"));
        }
        if (copy_back) out.copy_(buffer);
      };
    }
    return plan;
  }

  std::shared_ptr<Rendezvous> rendezvous_;
  c10::intrusive_ptr<c10d::Store> base_;
  std::string prefix_;
  c10::intrusive_ptr<c10d::Store> store_;  // the group's, over base_
  std::function<bool()> abandoned_;  // the formation of this group and of its subgroups is given up when true
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  bool broken_ = false;
  std::chrono::steady_clock::time_point broken_at_{};
};

GlooWork::GlooWork(GlooCommunicator* comm, std::string op, int peer, c10::intrusive_ptr<c10d::Work> work,
                   std::function<void()> finish)
    : Work(comm->timeout()), comm_(comm), op_(std::move(op)), peer_(peer), work_(std::move(work)),
      finish_(std::move(finish)) {}

void GlooWork::wait(Millis timeout) {
  if (done_) return;
  std::string cause;
  try {
    work_->wait(timeout);
  } catch (const c10::Error& e) {
    cause = first_line(e.what_without_backtrace());
  } catch (const std::exception& e) {
    cause = first_line(e.what());
  }
  if (!cause.empty()) {
    comm_->mark_broken();
    CommContext c = comm_->context_for(op_, peer_);
    c.timeout = timeout;
    bool timed_out = cause.find("imed out") != std::string::npos || cause.find("imeout") != std::string::npos;
    throw CommError(c, cause, timed_out);
  }
  if (finish_) finish_();
  done_ = true;
}

// The future of a collective completes on Gloo's thread, which then wakes this one: no polling, no hand-off.
// Sends and receives have no future (Gloo completes them inside wait): std::nullopt.
std::optional<bool> GlooWork::wait_unless(Millis timeout, const std::function<bool()>& give_up) {
  if (done_) return true;
  c10::intrusive_ptr<c10::ivalue::Future> future;
  try {
    future = work_->getFuture();
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (!future) return std::nullopt;
  struct Signal {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
  };
  auto signal = std::make_shared<Signal>();  // outlives this Work when the wait is abandoned
  future->addCallback([signal](c10::ivalue::Future&) {
    std::lock_guard<std::mutex> lock(signal->mu);
    signal->done = true;
    signal->cv.notify_all();
  });
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  {
    std::unique_lock<std::mutex> lock(signal->mu);
    while (!signal->cv.wait_for(lock, Millis(20), [&] { return signal->done; })) {
      if (give_up()) return false;
      if (std::chrono::steady_clock::now() > deadline) break;  // wait() below reports the timeout
    }
  }
  wait(timeout);
  return true;
}

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(std::shared_ptr<Rendezvous> rendezvous, int rank, int size,
                                                     Millis timeout, const std::string& name,
                                                     std::function<bool()> abandoned) {
  c10::intrusive_ptr<c10d::Store> base = rendezvous->store();
  return std::make_unique<GlooCommunicator>(std::move(rendezvous), std::move(base), name + "/", name, rank, size,
                                            timeout, std::move(abandoned));
}

}  // namespace crosstrain::comm
