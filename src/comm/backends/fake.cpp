#include <ATen/ATen.h>

#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/comm/reference.h"

namespace crosstrain::comm {
namespace detail {

// One collective call of one group: every member posts into it, then each computes its own result.
struct Slot {
  std::vector<at::Tensor> inputs;  // undefined where a rank contributes nothing (non-roots of scatter)
  std::vector<std::string> ops;    // what each rank called, to detect mismatched calls
  int posted = 0;
  int released = 0;
};

struct FakeHub {
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::pair<std::string, uint64_t>, std::shared_ptr<Slot>> slots;
  std::map<std::tuple<std::string, int, int, int>, std::deque<at::Tensor>> mailboxes;  // group, src, dst, tag
};

}  // namespace detail

namespace {

using detail::FakeHub;
using detail::Slot;

class FakeCommunicator;

// Waits for all members of a slot, then runs `finish` with every rank's input.
class CollectiveWork : public Work {
 public:
  using Finish = std::function<void(const std::vector<at::Tensor>&)>;
  CollectiveWork(const FakeCommunicator* comm, std::string op, std::shared_ptr<Slot> slot,
                 std::pair<std::string, uint64_t> key, Finish finish);
  void wait(Millis timeout) override;
  bool is_completed() override;

 private:
  const FakeCommunicator* comm_;
  std::string op_;
  std::shared_ptr<Slot> slot_;
  std::pair<std::string, uint64_t> key_;
  Finish finish_;
  bool done_ = false;
};

class RecvWork : public Work {
 public:
  RecvWork(const FakeCommunicator* comm, at::Tensor out, int src, int tag);
  void wait(Millis timeout) override;
  bool is_completed() override;

 private:
  const FakeCommunicator* comm_;
  at::Tensor out_;
  int src_;
  int tag_;
  bool done_ = false;
};

class FakeCommunicator : public Communicator {
 public:
  FakeCommunicator(std::shared_ptr<FakeHub> hub, std::string name, int rank, int size, Millis timeout)
      : Communicator("fake", std::move(name), rank, size, timeout), hub_(std::move(hub)) {}

  FakeHub& hub() const { return *hub_; }
  [[noreturn]] void raise(const std::string& op, const std::string& cause, int peer = -1,
                          bool timed_out = false, std::optional<Millis> timeout = std::nullopt) const {
    CommContext c = context(op, peer);
    c.timeout = timeout;
    throw CommError(c, cause, timed_out);
  }

  WorkPtr broadcast(at::Tensor& tensor, int root) override {
    check_tensor("broadcast", tensor, "the");
    check_root("broadcast", root);
    at::Tensor out = tensor;
    return post("broadcast", rank() == root ? tensor : at::Tensor(), [out, root](const auto& in) mutable {
      out.copy_(in[root].view_as(out));
    });
  }

  WorkPtr reduce(at::Tensor& tensor, int root, ReduceOp op) override {
    const std::string name = std::string("reduce(") + to_string(op) + ")";
    check_tensor(name, tensor, "the");
    check_root(name, root);
    at::Tensor out = tensor;
    bool is_root = rank() == root;
    return post(name, tensor, [out, op, is_root](const auto& in) mutable {
      if (is_root) out.copy_(reduce_reference(in, op));
    });
  }

  WorkPtr all_reduce(at::Tensor& tensor, ReduceOp op) override {
    const std::string name = std::string("allreduce(") + to_string(op) + ")";
    check_tensor(name, tensor, "the");
    at::Tensor out = tensor;
    return post(name, tensor, [out, op](const auto& in) mutable { out.copy_(reduce_reference(in, op)); });
  }

  WorkPtr gather(const at::Tensor& input, at::Tensor& output, int root) override {
    check_tensor("gather", input, "input");
    check_root("gather", root);
    if (rank() == root) {
      check_tensor("gather", output, "output");
      check_same_dtype("gather", input, output);
      check_sliced("gather", input, output);
    }
    at::Tensor out = output;
    bool is_root = rank() == root;
    return post("gather", input, [out, is_root](const auto& in) mutable {
      if (is_root) concat_into(out, in);
    });
  }

  WorkPtr all_gather(const at::Tensor& input, at::Tensor& output) override {
    check_tensor("allgather", input, "input");
    check_tensor("allgather", output, "output");
    check_same_dtype("allgather", input, output);
    check_sliced("allgather", input, output);
    at::Tensor out = output;
    return post("allgather", input, [out](const auto& in) mutable { concat_into(out, in); });
  }

  WorkPtr scatter(const at::Tensor& input, at::Tensor& output, int root) override {
    check_tensor("scatter", output, "output");
    check_root("scatter", root);
    if (rank() == root) {
      check_tensor("scatter", input, "input");
      check_same_dtype("scatter", input, output);
      check_sliced("scatter", output, input);
    }
    at::Tensor out = output;
    int me = rank();
    int n = size();
    return post("scatter", rank() == root ? input : at::Tensor(), [out, root, me, n](const auto& in) mutable {
      out.copy_(in[root].reshape({n, -1})[me].view_as(out));
    });
  }

  WorkPtr reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override {
    const std::string name = std::string("reducescatter(") + to_string(op) + ")";
    check_tensor(name, input, "input");
    check_tensor(name, output, "output");
    check_same_dtype(name, input, output);
    check_sliced(name, output, input);
    at::Tensor out = output;
    int me = rank();
    int n = size();
    return post(name, input, [out, op, me, n](const auto& in) mutable {
      std::vector<at::Tensor> mine;
      for (const auto& t : in) mine.push_back(t.reshape({n, -1})[me]);
      out.copy_(reduce_reference(mine, op).view_as(out));
    });
  }

  WorkPtr all_to_all(const at::Tensor& input, at::Tensor& output) override {
    check_all_to_all(input, output);
    at::Tensor out = output;
    int me = rank();
    int n = size();
    return post("alltoall", input, [out, me, n](const auto& in) mutable {
      std::vector<at::Tensor> mine;
      for (const auto& t : in) mine.push_back(t.reshape({n, -1})[me]);
      concat_into(out, mine);
    });
  }

  WorkPtr barrier() override {
    return post("barrier", at::Tensor(), [](const auto&) {});
  }

  WorkPtr send(const at::Tensor& tensor, int dst, int tag) override {
    check_tensor("send", tensor, "the");
    check_peer("send", dst);
    std::lock_guard<std::mutex> lock(hub_->mutex);
    hub_->mailboxes[{name(), rank(), dst, tag}].push_back(tensor.clone());
    hub_->changed.notify_all();
    return completed_work();
  }

  WorkPtr recv(at::Tensor& tensor, int src, int tag) override {
    check_tensor("recv", tensor, "the");
    check_peer("recv", src);
    return std::make_shared<RecvWork>(this, tensor, src, tag);
  }

  std::unique_ptr<Communicator> split(const std::vector<int>& ranks) override {
    check_split_ranks(ranks);
    std::string sub = next_split_name();
    auto it = std::find(ranks.begin(), ranks.end(), rank());
    if (it == ranks.end()) return nullptr;
    return std::make_unique<FakeCommunicator>(hub_, sub, static_cast<int>(it - ranks.begin()),
                                              static_cast<int>(ranks.size()), timeout());
  }

 private:
  static void concat_into(at::Tensor& out, const std::vector<at::Tensor>& parts) {
    auto rows = out.view({static_cast<int64_t>(parts.size()), -1});
    for (size_t i = 0; i < parts.size(); ++i) rows[static_cast<int64_t>(i)].copy_(parts[i].reshape(-1));
  }

  WorkPtr post(const std::string& op, const at::Tensor& input, CollectiveWork::Finish finish) {
    auto key = std::make_pair(name(), seq_++);
    std::shared_ptr<Slot> slot;
    {
      std::lock_guard<std::mutex> lock(hub_->mutex);
      auto& s = hub_->slots[key];
      if (!s) {
        s = std::make_shared<Slot>();
        s->inputs.resize(size());
        s->ops.resize(size());
      }
      slot = s;
      slot->inputs[rank()] = input.defined() ? input.clone() : at::Tensor();
      slot->ops[rank()] = op;
      slot->posted++;
      hub_->changed.notify_all();
    }
    return std::make_shared<CollectiveWork>(this, op, slot, key, std::move(finish));
  }

  std::shared_ptr<FakeHub> hub_;
  uint64_t seq_ = 0;
};

CollectiveWork::CollectiveWork(const FakeCommunicator* comm, std::string op, std::shared_ptr<Slot> slot,
                               std::pair<std::string, uint64_t> key, Finish finish)
    : Work(comm->timeout()), comm_(comm), op_(std::move(op)), slot_(std::move(slot)), key_(std::move(key)),
      finish_(std::move(finish)) {}

bool CollectiveWork::is_completed() {
  std::lock_guard<std::mutex> lock(comm_->hub().mutex);
  return done_ || slot_->posted == comm_->size();
}

void CollectiveWork::wait(Millis timeout) {
  if (done_) return;
  FakeHub& hub = comm_->hub();
  const int n = comm_->size();
  {
    std::unique_lock<std::mutex> lock(hub.mutex);
    if (!hub.changed.wait_for(lock, timeout, [&] { return slot_->posted == n; })) {
      std::string missing;
      int first_missing = -1;
      for (int r = 0; r < n; ++r) {
        if (slot_->ops[r].empty()) {
          if (first_missing < 0) first_missing = r;
          missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        }
      }
      comm_->raise(op_, "timed out waiting for rank(s) " + missing + " to join", first_missing, true, timeout);
    }
    for (int r = 0; r < n; ++r) {
      if (slot_->ops[r] != op_)
        comm_->raise(op_, "mismatched collectives: this rank called " + op_ + " but rank " + std::to_string(r) +
                              " called " + slot_->ops[r] + " at the same position",
                     r);
    }
  }
  finish_(slot_->inputs);
  done_ = true;
  std::lock_guard<std::mutex> lock(hub.mutex);
  if (++slot_->released == n) hub.slots.erase(key_);
}

RecvWork::RecvWork(const FakeCommunicator* comm, at::Tensor out, int src, int tag)
    : Work(comm->timeout()), comm_(comm), out_(std::move(out)), src_(src), tag_(tag) {}

bool RecvWork::is_completed() {
  if (done_) return true;
  std::lock_guard<std::mutex> lock(comm_->hub().mutex);
  auto it = comm_->hub().mailboxes.find({comm_->name(), src_, comm_->rank(), tag_});
  return it != comm_->hub().mailboxes.end() && !it->second.empty();
}

void RecvWork::wait(Millis timeout) {
  if (done_) return;
  FakeHub& hub = comm_->hub();
  std::unique_lock<std::mutex> lock(hub.mutex);
  auto key = std::make_tuple(comm_->name(), src_, comm_->rank(), tag_);
  if (!hub.changed.wait_for(lock, timeout, [&] {
        auto it = hub.mailboxes.find(key);
        return it != hub.mailboxes.end() && !it->second.empty();
      })) {
    comm_->raise("recv(tag " + std::to_string(tag_) + ")", "no message arrived", src_, true, timeout);
  }
  auto& queue = hub.mailboxes[key];
  at::Tensor message = queue.front();
  queue.pop_front();
  lock.unlock();
  if (message.numel() != out_.numel() || message.scalar_type() != out_.scalar_type())
    comm_->raise("recv(tag " + std::to_string(tag_) + ")",
                 "message of " + std::to_string(message.numel()) + " " + c10::toString(message.scalar_type()) +
                     " elements does not fit a buffer of " + std::to_string(out_.numel()) + " " +
                     c10::toString(out_.scalar_type()),
                 src_);
  out_.copy_(message.view_as(out_));
  done_ = true;
}

}  // namespace

FakeWorld::FakeWorld(int size, Millis timeout) : size_(size), timeout_(timeout), hub_(std::make_shared<FakeHub>()) {
  if (size < 1) throw UsageError("FakeWorld needs at least one rank, got " + std::to_string(size));
}

std::unique_ptr<Communicator> FakeWorld::communicator(int rank) {
  if (rank < 0 || rank >= size_)
    throw UsageError("FakeWorld rank " + std::to_string(rank) + " is outside 0.." + std::to_string(size_ - 1));
  return std::make_unique<FakeCommunicator>(hub_, "world", rank, size_, timeout_);
}

void FakeWorld::run(int size, const std::function<void(Communicator&)>& body, Millis timeout) {
  FakeWorld world(size, timeout);
  std::vector<std::exception_ptr> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto comm = world.communicator(r);
        body(*comm);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace crosstrain::comm
