// Always-on traces: each rank records spans (training phases, collectives, pipeline transfers, waits) into a
// bounded in-memory buffer that a background thread appends to run.dir/traces/rank-R.json every few hundred
// steps, in the Chrome/Perfetto JSON array format (docs/observability.md has the event list). Recording a span
// costs a lock and a copy of a small struct; formatting and writing happen off the training thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace crosstrain::obs {

enum class SpanKind : uint8_t { Step, Data, Compute, P2P, Optimizer, Wait, Comm, Sync, Checkpoint, Eval, Elastic };
const char* category(SpanKind kind);

struct Span {
  SpanKind kind = SpanKind::Step;
  const char* name = "";  // a static string
  int64_t ts_us = 0, dur_us = 0;
  int tid = 0;            // 0: the training thread; the tracer sets it for the rest
  int64_t step = -1;
  int mb = -1, stage = -1, peer = -1;
  int group = -1;         // Tracer::group(name) (collectives and waits)
  int64_t seq = -1, bytes = -1;
  const char* op = nullptr;     // waits: the operation waited for
  const char* state = nullptr;  // collectives: "completed" / "failed"
};

// Who wrote the trace and how its clock relates to rank 0's (the crosstrain_clock metadata event).
struct TraceIdentity {
  int rank = 0, world_size = 1;
  int dp = 1, pp = 1, tp = 1, dp_index = 0, pp_index = 0, tp_index = 0;
  int64_t offset_us = 0, rtt_us = 0;  // ts + offset_us = rank 0's clock
  int64_t unix_us = 0;                // the wall clock at ts = 0
};

struct MemorySample {
  int64_t rss_bytes = 0, peak_rss_bytes = 0, model_state_bytes = 0;
};

// Pure: one event as a line of the trace file (with its trailing comma). Group names by index.
std::string format_span(const Span& s, int pid, const std::vector<std::string>& groups);

// Lanes for spans that may overlap on one track (collectives in flight): each span goes to the first lane whose
// last span ended before it starts. Pure and deterministic; the writer keeps one per group.
class LaneAssigner {
 public:
  // Returns the lane (0, 1, ...) and whether it is new.
  std::pair<int, bool> place(int64_t start_us, int64_t end_us);

 private:
  std::vector<int64_t> last_end_;
};

class Tracer {
 public:
  // Creates the directory, starts `path` over (or adds to it: `append`) and writes the metadata.
  // `capacity`: spans held between flushes.
  Tracer(std::string path, TraceIdentity identity, size_t capacity, bool append = false);
  ~Tracer();  // writes what is left and stops the writer
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  void add(Span span);  // any thread
  int group(const std::string& name);
  // Hands the buffer to the writer thread (never blocks on the disk); `memory` goes in as a counter.
  void flush(const MemorySample& memory);
  int64_t dropped() const;
  const std::string& path() const { return path_; }

  // A span of the training thread from construction to destruction.
  class Scope {
   public:
    Scope(Tracer* tracer, SpanKind kind, const char* name, int64_t step, int mb = -1, int stage = -1);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Tracer* tracer_;
    Span span_;
  };

 private:
  struct Batch {
    std::vector<Span> spans;
    MemorySample memory;
    int64_t dropped = 0;
    int64_t ts_us = 0;
  };
  void writer_loop();
  void write_batch(const Batch& batch);
  void write_line(const std::string& line);

  std::string path_;
  TraceIdentity identity_;
  size_t capacity_;
  std::thread::id training_thread_;
  std::FILE* file_ = nullptr;

  mutable std::mutex mu_;
  std::vector<Span> buffer_;
  size_t dropped_since_flush_ = 0;
  int64_t dropped_total_ = 0;
  std::vector<std::string> groups_;
  std::map<std::thread::id, int> other_threads_;

  std::mutex writer_mu_;
  std::condition_variable writer_cv_;
  std::vector<Batch> queue_;
  bool stopping_ = false;
  std::map<std::pair<int, int>, LaneAssigner> lanes_;  // writer thread only: (group, 0) -> lanes
  std::thread writer_;
};

// Current resident memory of this process (VmRSS), in bytes.
int64_t rss_bytes();
// The part of it that is anonymous memory (heap, stacks): resident pages less file-backed ones (mapped files such
// as memory-mapped embedding tables, which the kernel can write back and drop).
int64_t anonymous_rss_bytes();

}  // namespace crosstrain::obs
