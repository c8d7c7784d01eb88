#include "crosstrain/comm/backends/mpi.h"

#include <ATen/ATen.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#ifdef CROSSTRAIN_WITH_MPI
#include <mpi.h>
#endif

namespace crosstrain::comm {

#ifndef CROSSTRAIN_WITH_MPI
bool mpi_available() { return false; }
bool mpi_thread_multiple() { return false; }
std::unique_ptr<Communicator> make_mpi_world(Millis) {
  throw UsageError("this build of crosstrain has no MPI back end (install libopenmpi-dev and rebuild)");
}
#else
namespace {

using Clock = std::chrono::steady_clock;

// MPI's own type for a dtype it can reduce; MPI_DATATYPE_NULL when it has none (half, bfloat16).
MPI_Datatype mpi_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kChar: return MPI_INT8_T;
    case at::kByte: return MPI_UINT8_T;
    case at::kShort: return MPI_INT16_T;
    case at::kInt: return MPI_INT32_T;
    case at::kLong: return MPI_INT64_T;
    case at::kBool: return MPI_C_BOOL;
    case at::kComplexFloat: return MPI_C_FLOAT_COMPLEX;
    case at::kComplexDouble: return MPI_C_DOUBLE_COMPLEX;
    default: return MPI_DATATYPE_NULL;
  }
}

std::string mpi_error(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<size_t>(length));
}

// Set once any operation of the job failed or timed out (shared by the world and its sub-groups): the peers are
// out of step, so later waits fail at once and the world must not call MPI_Finalize, which would wait forever for
// the hung peer and keep the error from ever being printed.
class FirstFailure {
 public:
  bool set() const { return set_.load(); }
  std::string text() {
    std::lock_guard<std::mutex> lock(mutex_);
    return text_;
  }
  void latch(const std::string& text) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (set_.load()) return;
    text_ = text;
    set_.store(true);
  }

 private:
  std::atomic<bool> set_{false};
  std::mutex mutex_;
  std::string text_;
};
using BrokenFlag = std::shared_ptr<FirstFailure>;

class MpiWork : public Work {
 public:
  MpiWork(Millis timeout, CommContext context, std::function<void()> finish, BrokenFlag broken)
      : Work(timeout), context_(std::move(context)), finish_(std::move(finish)), broken_(std::move(broken)) {}
  MPI_Request* request() { return &request_; }
  // Buffers MPI reads or writes until the operation completes.
  std::vector<at::Tensor> keep;
  void wait(Millis timeout) override {
    if (done_) return;
    const auto deadline = Clock::now() + timeout;
    for (int spin = 0;; ++spin) {
      int flag = 0;
      int rc = MPI_Test(&request_, &flag, MPI_STATUS_IGNORE);
      if (rc != MPI_SUCCESS) fail(mpi_error(rc), false);
      if (flag) break;
      if (broken_->set()) fail("not completed: an earlier MPI operation of this job failed (" + broken_->text() + ")", false);
      if (Clock::now() > deadline) {
        CommContext c = context_;
        c.timeout = timeout;
        broken_->latch(describe(c, "MPI operation did not complete"));
        throw CommError(c, "MPI operation did not complete", true);
      }
      if (spin > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    done_ = true;
    if (finish_) finish_();
  }
  bool is_completed() override {
    if (done_) return true;
    int flag = 0;
    MPI_Test(&request_, &flag, MPI_STATUS_IGNORE);
    if (flag) {
      done_ = true;
      if (finish_) finish_();
    }
    return done_;
  }

 private:
  [[noreturn]] void fail(const std::string& cause, bool timed_out) {
    broken_->latch(describe(context_, cause));
    throw CommError(context_, cause, timed_out);
  }

  MPI_Request request_ = MPI_REQUEST_NULL;
  CommContext context_;
  std::function<void()> finish_;
  BrokenFlag broken_;
  bool done_ = false;
};

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::string name, bool owns_mpi, Millis timeout, BrokenFlag broken)
      : Communicator("mpi", std::move(name), rank_of(comm), size_of(comm), timeout), comm_(comm), owns_mpi_(owns_mpi),
        broken_(std::move(broken)) {}
  ~MpiCommunicator() override {
    // After a failure the process exits with the error; mpirun then ends the other ranks. Finalizing (or freeing
    // a communicator with requests a hung peer never matched) would block instead.
    if (broken_->set()) return;
    if (comm_ != MPI_COMM_WORLD) MPI_Comm_free(&comm_);
    if (owns_mpi_) MPI_Finalize();
  }

  WorkPtr broadcast(at::Tensor& t, int root) override {
    check_tensor("broadcast", t, "the");
    check_root("broadcast", root);
    return start("broadcast", root, {}, [&](MPI_Request* r) {
      return MPI_Ibcast(t.data_ptr(), bytes(t), MPI_BYTE, root, comm_, r);
    });
  }

  WorkPtr reduce(at::Tensor& t, int root, ReduceOp op) override {
    const std::string name = std::string("reduce(") + to_string(op) + ")";
    check_tensor(name, t, "the");
    check_root(name, root);
    auto plan = prepare(name, t, op, rank() == root);
    return start(name, root, plan.finish, [&](MPI_Request* r) {
      return MPI_Ireduce(rank() == root ? MPI_IN_PLACE : plan.buffer.data_ptr(), plan.buffer.data_ptr(),
                         static_cast<int>(plan.buffer.numel()), plan.type, plan.op, root, comm_, r);
    }, {plan.buffer});
  }

  WorkPtr all_reduce(at::Tensor& t, ReduceOp op) override {
    const std::string name = std::string("allreduce(") + to_string(op) + ")";
    check_tensor(name, t, "the");
    auto plan = prepare(name, t, op, true);
    return start(name, -1, plan.finish, [&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, plan.buffer.data_ptr(), static_cast<int>(plan.buffer.numel()), plan.type,
                            plan.op, comm_, r);
    }, {plan.buffer});
  }

  WorkPtr gather(const at::Tensor& in, at::Tensor& out, int root) override {
    check_tensor("gather", in, "input");
    check_root("gather", root);
    if (rank() == root) {
      check_tensor("gather", out, "output");
      check_same_dtype("gather", in, out);
      check_sliced("gather", in, out);
    }
    return start("gather", root, {}, [&](MPI_Request* r) {
      return MPI_Igather(in.data_ptr(), bytes(in), MPI_BYTE, rank() == root ? out.data_ptr() : nullptr, bytes(in),
                         MPI_BYTE, root, comm_, r);
    });
  }

  WorkPtr all_gather(const at::Tensor& in, at::Tensor& out) override {
    check_tensor("allgather", in, "input");
    check_tensor("allgather", out, "output");
    check_same_dtype("allgather", in, out);
    check_sliced("allgather", in, out);
    return start("allgather", -1, {}, [&](MPI_Request* r) {
      return MPI_Iallgather(in.data_ptr(), bytes(in), MPI_BYTE, out.data_ptr(), bytes(in), MPI_BYTE, comm_, r);
    });
  }

  WorkPtr scatter(const at::Tensor& in, at::Tensor& out, int root) override {
    check_tensor("scatter", out, "output");
    check_root("scatter", root);
    if (rank() == root) {
      check_tensor("scatter", in, "input");
      check_same_dtype("scatter", in, out);
      check_sliced("scatter", out, in);
    }
    return start("scatter", root, {}, [&](MPI_Request* r) {
      return MPI_Iscatter(rank() == root ? in.data_ptr() : nullptr, bytes(out), MPI_BYTE, out.data_ptr(), bytes(out),
                          MPI_BYTE, root, comm_, r);
    });
  }

  WorkPtr reduce_scatter(const at::Tensor& in, at::Tensor& out, ReduceOp op) override {
    const std::string name = std::string("reducescatter(") + to_string(op) + ")";
    check_tensor(name, in, "input");
    check_tensor(name, out, "output");
    check_same_dtype(name, in, out);
    check_sliced(name, out, in);
    at::Tensor full = in.clone();
    auto plan = prepare(name, full, op, false);
    // The reduced slice lands in a scratch buffer of the reduction type, then is averaged and copied out.
    at::Tensor mine = at::empty({plan.buffer.numel() / size()}, plan.buffer.options());
    auto copy_out = [mine, out, avg = op == ReduceOp::Avg, n = size()]() mutable {
      at::Tensor r = mine;
      if (avg) r = at::isFloatingType(r.scalar_type()) || at::isComplexType(r.scalar_type()) ? r / n : at::div(r, n, "trunc");
      out.view({-1}).copy_(r.to(out.scalar_type()).reshape({-1}));
    };
    return start(name, -1, copy_out, [&](MPI_Request* r) {
      return MPI_Ireduce_scatter_block(plan.buffer.data_ptr(), mine.data_ptr(), static_cast<int>(mine.numel()),
                                       plan.type, plan.op, comm_, r);
    }, {plan.buffer, mine});
  }

  WorkPtr all_to_all(const at::Tensor& in, at::Tensor& out) override {
    check_all_to_all(in, out);
    const int each = bytes(in) / size();
    return start("alltoall", -1, {}, [&](MPI_Request* r) {
      return MPI_Ialltoall(in.data_ptr(), each, MPI_BYTE, out.data_ptr(), each, MPI_BYTE, comm_, r);
    });
  }

  WorkPtr barrier() override {
    return start("barrier", -1, {}, [&](MPI_Request* r) { return MPI_Ibarrier(comm_, r); });
  }

  WorkPtr send(const at::Tensor& t, int dst, int tag) override {
    const std::string name = "send(tag " + std::to_string(tag) + ")";
    check_tensor(name, t, "the");
    check_peer(name, dst);
    at::Tensor keep = t;  // alive until the send completes
    return start(name, dst, [keep] {}, [&](MPI_Request* r) {
      return MPI_Isend(keep.data_ptr(), bytes(keep), MPI_BYTE, dst, tag, comm_, r);
    });
  }

  WorkPtr recv(at::Tensor& t, int src, int tag) override {
    const std::string name = "recv(tag " + std::to_string(tag) + ")";
    check_tensor(name, t, "the");
    check_peer(name, src);
    return start(name, src, {}, [&](MPI_Request* r) {
      return MPI_Irecv(t.data_ptr(), bytes(t), MPI_BYTE, src, tag, comm_, r);
    });
  }

  std::unique_ptr<Communicator> split(const std::vector<int>& ranks) override {
    check_split_ranks(ranks);
    std::string sub = next_split_name();
    auto it = std::find(ranks.begin(), ranks.end(), rank());
    const int color = it == ranks.end() ? MPI_UNDEFINED : 0;
    const int key = it == ranks.end() ? 0 : static_cast<int>(it - ranks.begin());
    MPI_Comm out = MPI_COMM_NULL;
    int rc = MPI_Comm_split(comm_, color, key, &out);
    if (rc != MPI_SUCCESS) fail("split", mpi_error(rc));
    if (out == MPI_COMM_NULL) return nullptr;
    return std::make_unique<MpiCommunicator>(out, sub, false, timeout(), broken_);
  }

 private:
  struct Plan {
    at::Tensor buffer;
    MPI_Datatype type;
    MPI_Op op;
    std::function<void()> finish;
  };

  static int rank_of(MPI_Comm c) {
    int r = 0;
    MPI_Comm_rank(c, &r);
    return r;
  }
  static int size_of(MPI_Comm c) {
    int n = 0;
    MPI_Comm_size(c, &n);
    return n;
  }
  int bytes(const at::Tensor& t) const {
    const int64_t b = t.numel() * static_cast<int64_t>(t.element_size());
    if (b > INT32_MAX) fail("mpi", "buffers over 2 GiB are not supported by this back end yet");
    return static_cast<int>(b);
  }

  // The buffer MPI reduces (the tensor, or a float copy for half/bfloat16), MPI's op, and what to do after.
  Plan prepare(const std::string& name, at::Tensor& t, ReduceOp op, bool gets_result) {
    const auto dtype = t.scalar_type();
    Plan p;
    p.buffer = t;
    p.type = mpi_type(dtype);
    if (p.type == MPI_DATATYPE_NULL) {
      p.buffer = t.to(at::kFloat);
      p.type = MPI_FLOAT;
    }
    const bool is_bool = dtype == at::kBool, is_complex = at::isComplexType(dtype);
    if (is_bool && op == ReduceOp::Avg) fail(name, "avg is not defined for bool tensors; use sum (or) or min");
    if (is_complex && op != ReduceOp::Sum && op != ReduceOp::Avg)
      fail(name, std::string(to_string(op)) + " is not supported for complex tensors (only sum and avg)");
    switch (op) {
      case ReduceOp::Sum: case ReduceOp::Avg: p.op = is_bool ? MPI_LOR : MPI_SUM; break;
      case ReduceOp::Product: p.op = is_bool ? MPI_LAND : MPI_PROD; break;
      case ReduceOp::Min: p.op = is_bool ? MPI_LAND : MPI_MIN; break;
      case ReduceOp::Max: p.op = is_bool ? MPI_LOR : MPI_MAX; break;
    }
    const bool widened = !p.buffer.is_same(t);
    const bool avg = op == ReduceOp::Avg;
    if (gets_result && (widened || avg)) {
      at::Tensor out = t, buffer = p.buffer;
      const int n = size();
      p.finish = [out, buffer, widened, avg, n]() mutable {
        if (avg) {
          if (at::isFloatingType(buffer.scalar_type()) || at::isComplexType(buffer.scalar_type())) buffer.div_(n);
          else buffer.copy_(at::div(buffer, n, "trunc"));
        }
        if (widened) out.copy_(buffer);
      };
    }
    return p;
  }

  template <typename Launch>
  WorkPtr start(const std::string& op, int peer, std::function<void()> finish, Launch&& launch,
                std::vector<at::Tensor> keep = {}) {
    auto work = std::make_shared<MpiWork>(timeout(), context(op, peer), std::move(finish), broken_);
    work->keep = std::move(keep);
    int rc = launch(work->request());
    if (rc != MPI_SUCCESS) fail(op, mpi_error(rc), peer);
    return work;
  }

  MPI_Comm comm_;
  bool owns_mpi_;
  BrokenFlag broken_;
};

}  // namespace

bool mpi_available() { return true; }

bool mpi_thread_multiple() {
  int initialized = 0, level = 0;
  MPI_Initialized(&initialized);
  return initialized && MPI_Query_thread(&level) == MPI_SUCCESS && level >= MPI_THREAD_MULTIPLE;
}

std::unique_ptr<Communicator> make_mpi_world(Millis timeout) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    // Errors come back as codes (turned into CommError) instead of aborting the job.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  }
  return std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world", !initialized, timeout,
                                           std::make_shared<FirstFailure>());
}
#endif

}  // namespace crosstrain::comm
