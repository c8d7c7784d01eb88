#include <ATen/ATen.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <sched.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "crosstrain/comm/backends/shm.h"
#include "../forwarding_communicator.h"
#include "../serial_worker.h"

namespace crosstrain::comm {
namespace {

using Clock = std::chrono::steady_clock;

// One counter per rank and cache line: arrived = the round whose data is in its slot, consumed = the round
// it has finished reading.
struct alignas(64) RankState {
  std::atomic<uint32_t> arrived;
  std::atomic<uint32_t> consumed;
  // Ranks asleep on a futex on either counter: a store wakes them only when there are any, so the latency-bound
  // path (peers spinning) makes no system call.
  std::atomic<uint32_t> sleepers;
};

// A process that exited: gone, or a zombie its parent has not reaped yet.
bool alive(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = std::fopen(path, "r");
  if (!f) return false;
  char state = '?';
  // The state follows the command name, which is in parentheses and may contain spaces.
  char line[512] = {0};
  if (std::fgets(line, sizeof line, f)) {
    const char* close = std::strrchr(line, ')');
    if (close && close[1] == ' ') state = close[2];
  }
  std::fclose(f);
  return state != 'Z' && state != 'X';
}

void futex_wake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

// Publishes `value` and wakes sleepers, if any. With the sleeper's fetch_add (both sequentially consistent),
// either this sees the sleeper or the sleeper sees the value before it sleeps; a missed wake-up would cost at most
// the sleeper's 1 ms timeout anyway.
void publish(std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleepers, uint32_t value) {
  word.store(value, std::memory_order_release);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (sleepers.load(std::memory_order_relaxed) > 0) futex_wake(&word);
}

void futex_wait(std::atomic<uint32_t>* word, uint32_t seen, std::chrono::microseconds at_most) {
  timespec ts{0, static_cast<long>(at_most.count() * 1000)};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

class Segment {
 public:
  Segment(const std::string& name, bool create, int ranks, int64_t slot_bytes)
      : ranks_(ranks), slot_bytes_(slot_bytes) {
    bytes_ = sizeof(RankState) * ranks + static_cast<size_t>(slot_bytes) * ranks;
    int fd = shm_open(name.c_str(), create ? (O_CREAT | O_EXCL | O_RDWR) : O_RDWR, 0600);
    if (fd < 0) throw Error("shared memory: cannot open '" + name + "': " + std::strerror(errno));
    if (create && ftruncate(fd, static_cast<off_t>(bytes_)) != 0) {
      close(fd);
      throw Error("shared memory: cannot size '" + name + "': " + std::strerror(errno));
    }
    base_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base_ == MAP_FAILED) throw Error("shared memory: cannot map '" + name + "': " + std::strerror(errno));
  }
  ~Segment() { munmap(base_, bytes_); }
  RankState& state(int r) { return static_cast<RankState*>(base_)[r]; }
  char* slot(int r) { return static_cast<char*>(base_) + sizeof(RankState) * ranks_ + static_cast<size_t>(slot_bytes_) * r; }
  int64_t slot_bytes() const { return slot_bytes_; }

 private:
  int ranks_;
  int64_t slot_bytes_;
  size_t bytes_;
  void* base_;
};

class ShmCommunicator : public ForwardingCommunicator {
 public:
  ShmCommunicator(std::unique_ptr<Communicator> inner, std::unique_ptr<Segment> segment, std::vector<int64_t> pids,
                  std::function<bool()> abandoned)
      : ForwardingCommunicator(std::move(inner), "shm"), segment_(std::move(segment)), pids_(std::move(pids)),
        abandoned_(std::move(abandoned)) {}

  WorkPtr all_reduce(at::Tensor& tensor, ReduceOp op) override {
    const auto dtype = tensor.scalar_type();
    if ((dtype != at::kFloat && dtype != at::kDouble) || (op != ReduceOp::Sum && op != ReduceOp::Avg) ||
        !tensor.is_contiguous() || !tensor.device().is_cpu())
      return inner_->all_reduce(tensor, op);
    auto work = std::make_shared<DeferredWork>(timeout(), context(std::string("allreduce(") + to_string(op) + ")"));
    if (tensor.numel() == 0) {
      work->complete(nullptr);
      return work;
    }
    const std::string name = work->context().op;
    auto job = [this, t = tensor, op, name]() mutable { reduce(t, op, name); };
    // Small: in this thread when nothing is queued (latency-bound sizes); else in order on the worker.
    if (tensor.numel() * tensor.element_size() > kInlineBytes || !worker_.run_inline_if_idle(work, job))
      worker_.submit(work, std::move(job));
    return work;
  }

  // Everything else goes to the wrapped back end (ForwardingCommunicator).

 protected:
  std::unique_ptr<Communicator> wrap_group(std::unique_ptr<Communicator> sub) override {
    return with_shared_memory(std::move(sub), segment_->slot_bytes(), abandoned_);
  }

 private:
  // Waits until `word` reaches `target` (counters only grow, modulo wrap-around). A peer that died is noticed
  // within ~100 ms (same host: its process id is known), one that hangs at the timeout.
  void await(std::atomic<uint32_t>& word, std::atomic<uint32_t>& sleepers, uint32_t target, int peer,
             const char* what, const std::string& op, Clock::time_point deadline) {
    const auto start = Clock::now();
    auto next_check = start + std::chrono::milliseconds(100);
    for (int spin = 0;; ++spin) {
      uint32_t seen = word.load(std::memory_order_acquire);
      if (static_cast<int32_t>(seen - target) >= 0) return;
      if (spin < kMaxSpins) {
        if (spin > 200) sched_yield();  // give the peer its core on small machines
        // Spinning ends by the clock too: on a loaded machine each yield may hand the core away for milliseconds,
        // and 20,000 of them once kept a survivor of a dead peer from looking for half a minute.
        if ((spin & 63) != 0 || Clock::now() - start < kSpinFor) continue;
        spin = kMaxSpins;
      }
      const auto now = Clock::now();
      if (now > next_check) {
        next_check = now + std::chrono::milliseconds(100);
        check_peers(op, peer);
      }
      if (now > deadline) {
        CommContext c = context(op, peer);
        c.timeout = timeout();
        throw CommError(c, "rank " + std::to_string(peer) + " did not " + what + " (shared-memory all-reduce)", true);
      }
      sleepers.fetch_add(1, std::memory_order_seq_cst);
      seen = word.load(std::memory_order_seq_cst);
      if (static_cast<int32_t>(seen - target) < 0) futex_wait(&word, seen, std::chrono::microseconds(1000));
      sleepers.fetch_sub(1, std::memory_order_relaxed);
    }
  }

  // Any member gone means this call can never complete, whichever peer it waits for now (the others may wait
  // for this rank); so does a group its owner abandoned.
  void check_peers(const std::string& op, int waiting_for) const {
    for (int q = 0; q < size(); ++q)
      if (q != rank() && !alive(static_cast<pid_t>(pids_[q])))
        throw CommError(context(op, q), "rank " + std::to_string(q) + " (pid " + std::to_string(pids_[q]) +
                                            ") exited during a shared-memory all-reduce");
    if (abandoned_ && abandoned_())
      throw CommError(context(op, waiting_for), "the group was abandoned while this rank waited for rank " +
                                                    std::to_string(waiting_for) + " (a shared-memory all-reduce)");
  }

  void reduce(at::Tensor& t, ReduceOp op, const std::string& name) {
    const int n = size(), me = rank();
    const int64_t element = static_cast<int64_t>(t.element_size());
    const int64_t per_round = segment_->slot_bytes() / element;
    char* data = static_cast<char*>(t.data_ptr());
    const auto deadline = Clock::now() + timeout();
    for (int64_t offset = 0; offset < t.numel(); offset += per_round) {
      const int64_t count = std::min(per_round, t.numel() - offset);
      const uint32_t round = ++round_;
      // My slot is free once everyone has read the previous round.
      for (int q = 0; q < n; ++q) await(segment_->state(q).consumed, segment_->state(q).sleepers, round - 1, q, "finish the previous round", name, deadline);
      std::memcpy(segment_->slot(me), data + offset * element, static_cast<size_t>(count * element));
      publish(segment_->state(me).arrived, segment_->state(me).sleepers, round);
      for (int q = 0; q < n; ++q)
        await(segment_->state(q).arrived, segment_->state(q).sleepers, round, q, "arrive", name, deadline);
      // Sum in rank order: the same bits on every rank. A plain loop: no dispatch cost on small buffers, and
      // the compiler vectorizes it.
      if (count * element <= kInlineBytes) {
        if (t.scalar_type() == at::kFloat) sum_slots<float>(data + offset * element, count, op == ReduceOp::Avg);
        else sum_slots<double>(data + offset * element, count, op == ReduceOp::Avg);
      } else {
        auto slot = [&](int q) { return at::from_blob(segment_->slot(q), {count}, t.options()); };
        at::Tensor out = at::from_blob(data + offset * element, {count}, t.options());
        at::add_out(out, slot(0), slot(1));  // one pass over the first two slots instead of a copy and an add
        for (int q = 2; q < n; ++q) out.add_(slot(q));
        if (op == ReduceOp::Avg) out.div_(n);
      }
      publish(segment_->state(me).consumed, segment_->state(me).sleepers, round);
    }
  }

  template <typename T>
  void sum_slots(char* out_bytes, int64_t count, bool average) {
    T* __restrict out = reinterpret_cast<T*>(out_bytes);
    const T* __restrict first = reinterpret_cast<const T*>(segment_->slot(0));
    for (int64_t i = 0; i < count; ++i) out[i] = first[i];
    for (int q = 1; q < size(); ++q) {
      const T* __restrict in = reinterpret_cast<const T*>(segment_->slot(q));
      for (int64_t i = 0; i < count; ++i) out[i] += in[i];
    }
    if (average) {
      const T n = static_cast<T>(size());
      for (int64_t i = 0; i < count; ++i) out[i] /= n;
    }
  }

  std::unique_ptr<Segment> segment_;
  std::vector<int64_t> pids_;
  std::function<bool()> abandoned_;
  uint32_t round_ = 0;  // touched only by the job running (inline or on the worker): one at a time
  static constexpr int64_t kInlineBytes = 64 << 10;
  static constexpr int kMaxSpins = 20000;
  static constexpr std::chrono::microseconds kSpinFor{2000};
  SerialWorker worker_;  // last: destroyed (and drained) first
};

}  // namespace

std::unique_ptr<Communicator> with_shared_memory(std::unique_ptr<Communicator> inner, int64_t slot_bytes,
                                                 std::function<bool()> abandoned) {
  if (!inner || inner->size() < 2) return inner;
  // Same host? Compare host ids (hash of the hostname and boot id) over the group.
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::string id = host;
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "r")) {
    char boot[64] = {0};
    if (std::fgets(boot, sizeof boot, f)) id += boot;
    std::fclose(f);
  }
  const int64_t mine = static_cast<int64_t>(std::hash<std::string>{}(id) & 0x7fffffffffffffffLL);
  at::Tensor ids = at::empty({inner->size()}, at::kLong);
  inner->all_gather(at::full({1}, mine, at::kLong), ids)->wait();
  if (!at::all(ids.eq(mine)).item<bool>()) return inner;
  at::Tensor pid_table = at::empty({inner->size()}, at::kLong);
  inner->all_gather(at::full({1}, static_cast<int64_t>(getpid()), at::kLong), pid_table)->wait();
  std::vector<int64_t> pids(pid_table.data_ptr<int64_t>(), pid_table.data_ptr<int64_t>() + inner->size());
  // Rank 0 names and creates the segment; the others open it; then the name is removed (no leak on a crash).
  at::Tensor nonce = at::zeros({2}, at::kLong);
  if (inner->rank() == 0) {
    nonce[0] = static_cast<int64_t>(getpid());
    nonce[1] = static_cast<int64_t>(std::random_device{}() & 0x7fffffff);
  }
  inner->broadcast(nonce, 0)->wait();
  const std::string name = "/crosstrain-" + std::to_string(nonce[0].item<int64_t>()) + "-" +
                           std::to_string(nonce[1].item<int64_t>()) + "-" + std::to_string(inner->size());
  std::unique_ptr<Segment> segment;
  if (inner->rank() == 0) segment = std::make_unique<Segment>(name, true, inner->size(), slot_bytes);
  inner->barrier()->wait();
  if (inner->rank() != 0) segment = std::make_unique<Segment>(name, false, inner->size(), slot_bytes);
  inner->barrier()->wait();
  if (inner->rank() == 0) shm_unlink(name.c_str());
  return std::make_unique<ShmCommunicator>(std::move(inner), std::move(segment), std::move(pids), std::move(abandoned));
}

}  // namespace crosstrain::comm
