#include "crosstrain/obs/trace.h"

#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include "crosstrain/core/clock.h"
#include "crosstrain/core/error.h"

namespace crosstrain::obs {
namespace fs = std::filesystem;

namespace {

// Group names are the only free text in an event: escape what JSON needs.
std::string quoted(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out + "\"";
}

void arg(std::string& args, const char* key, int64_t value, bool present) {
  if (!present) return;
  args += args.empty() ? "" : ",";
  args += "\"" + std::string(key) + "\":" + std::to_string(value);
}

void arg(std::string& args, const char* key, const std::string& quoted_value) {
  args += args.empty() ? "" : ",";
  args += "\"" + std::string(key) + "\":" + quoted_value;
}

std::string metadata(int pid, int tid, const char* name, const std::string& args_json) {
  return "{\"ph\":\"M\",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(tid) + ",\"name\":\"" + name +
         "\",\"args\":" + args_json + "},";
}

}  // namespace

const char* category(SpanKind kind) {
  switch (kind) {
    case SpanKind::Step: return "step";
    case SpanKind::Data: return "data";
    case SpanKind::Compute: return "compute";
    case SpanKind::P2P: return "p2p";
    case SpanKind::Optimizer: return "optimizer";
    case SpanKind::Wait: return "wait";
    case SpanKind::Comm: return "comm";
    case SpanKind::Sync: return "sync";
    case SpanKind::Checkpoint: return "checkpoint";
    case SpanKind::Eval: return "eval";
    case SpanKind::Elastic: return "elastic";
  }
  return "?";
}

std::string format_span(const Span& s, int pid, const std::vector<std::string>& groups) {
  std::string args;
  arg(args, "step", s.step, s.step >= 0);
  arg(args, "mb", s.mb, s.mb >= 0);
  arg(args, "stage", s.stage, s.stage >= 0);
  arg(args, "peer", s.peer, s.peer >= 0);
  if (s.group >= 0 && s.group < static_cast<int>(groups.size())) arg(args, "group", quoted(groups[s.group]));
  arg(args, "seq", s.seq, s.seq >= 0);
  arg(args, "bytes", s.bytes, s.bytes >= 0);
  if (s.op) arg(args, "op", quoted(s.op));
  if (s.state) arg(args, "state", quoted(s.state));
  return "{\"ph\":\"X\",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(s.tid) +
         ",\"ts\":" + std::to_string(s.ts_us) + ",\"dur\":" + std::to_string(s.dur_us) + ",\"cat\":\"" +
         category(s.kind) + "\",\"name\":\"" + s.name + "\",\"args\":{" + args + "}},";
}

std::pair<int, bool> LaneAssigner::place(int64_t start_us, int64_t end_us) {
  for (size_t i = 0; i < last_end_.size(); ++i)
    if (last_end_[i] <= start_us) {
      last_end_[i] = end_us;
      return {static_cast<int>(i), false};
    }
  last_end_.push_back(end_us);
  return {static_cast<int>(last_end_.size() - 1), true};
}

Tracer::Tracer(std::string path, TraceIdentity identity, size_t capacity, bool append)
    : path_(std::move(path)), identity_(identity), capacity_(capacity), training_thread_(std::this_thread::get_id()) {
  std::error_code ec;
  fs::create_directories(fs::path(path_).parent_path(), ec);
  const bool continuing = append && fs::exists(path_) && fs::file_size(path_, ec) > 0;
  file_ = std::fopen(path_.c_str(), continuing ? "a" : "w");
  if (!file_)
    throw UsageError("cannot write the trace '" + path_ + "': check that run.dir is writable, or set obs.trace = false");
  buffer_.reserve(std::min<size_t>(capacity_, 4096));
  const int pid = identity_.rank;
  if (!continuing) write_line("[");
  write_line(metadata(pid, 0, "process_name", "{\"name\":\"rank " + std::to_string(pid) + "\"}"));
  write_line(metadata(pid, 0, "thread_name", "{\"name\":\"main\"}"));
  const TraceIdentity& i = identity_;
  write_line(metadata(pid, 0, "crosstrain_clock",
                      "{\"offset_us\":" + std::to_string(i.offset_us) + ",\"rtt_us\":" + std::to_string(i.rtt_us) +
                          ",\"rank\":" + std::to_string(i.rank) + ",\"world_size\":" + std::to_string(i.world_size) +
                          ",\"dp\":" + std::to_string(i.dp) + ",\"pp\":" + std::to_string(i.pp) +
                          ",\"tp\":" + std::to_string(i.tp) + ",\"dp_index\":" + std::to_string(i.dp_index) +
                          ",\"pp_index\":" + std::to_string(i.pp_index) + ",\"tp_index\":" +
                          std::to_string(i.tp_index) + ",\"unix_us\":" + std::to_string(i.unix_us) + "}"));
  std::fflush(file_);
  writer_ = std::thread([this] { writer_loop(); });
}

Tracer::~Tracer() {
  flush({});
  {
    std::lock_guard<std::mutex> lock(writer_mu_);
    stopping_ = true;
  }
  writer_cv_.notify_one();
  writer_.join();
  std::fclose(file_);
}

int Tracer::group(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < groups_.size(); ++i)
    if (groups_[i] == name) return static_cast<int>(i);
  groups_.push_back(name);
  return static_cast<int>(groups_.size() - 1);
}

void Tracer::add(Span span) {
  const std::thread::id self = std::this_thread::get_id();
  std::lock_guard<std::mutex> lock(mu_);
  if (span.kind != SpanKind::Comm && self != training_thread_) {
    auto it = other_threads_.find(self);
    if (it == other_threads_.end()) it = other_threads_.emplace(self, static_cast<int>(other_threads_.size()) + 1).first;
    span.tid = it->second;
  }
  if (buffer_.size() >= capacity_) {
    // Full between two flushes: the oldest half goes (counted), so that the newest steps stay whole.
    const size_t drop = buffer_.size() / 2;
    buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<std::ptrdiff_t>(drop));
    dropped_since_flush_ += drop;
  }
  buffer_.push_back(span);
}

void Tracer::flush(const MemorySample& memory) {
  Batch batch;
  batch.memory = memory;
  batch.ts_us = monotonic_us();
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.spans.swap(buffer_);
    buffer_.reserve(std::min<size_t>(capacity_, 4096));
    batch.dropped = static_cast<int64_t>(dropped_since_flush_);
    dropped_total_ += batch.dropped;
    dropped_since_flush_ = 0;
  }
  {
    std::lock_guard<std::mutex> lock(writer_mu_);
    queue_.push_back(std::move(batch));
  }
  writer_cv_.notify_one();
}

int64_t Tracer::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_total_ + static_cast<int64_t>(dropped_since_flush_);
}

void Tracer::writer_loop() {
  for (;;) {
    std::vector<Batch> work;
    {
      std::unique_lock<std::mutex> lock(writer_mu_);
      writer_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      work.swap(queue_);
      if (work.empty() && stopping_) return;
    }
    for (const Batch& b : work) write_batch(b);
    std::fflush(file_);
  }
}

void Tracer::write_batch(const Batch& batch) {
  std::vector<std::string> groups;
  {
    std::lock_guard<std::mutex> lock(mu_);
    groups = groups_;
  }
  const int pid = identity_.rank;
  for (Span s : batch.spans) {
    if (s.kind == SpanKind::Comm) {
      // Collectives in flight overlap: each group gets lanes (tracks) on which spans never overlap.
      auto [lane, fresh] = lanes_[{s.group, 0}].place(s.ts_us, s.ts_us + s.dur_us);
      s.tid = 1000 * (s.group + 1) + lane;
      if (fresh) {
        const std::string name = s.group >= 0 && s.group < static_cast<int>(groups.size()) ? groups[s.group] : "?";
        write_line(metadata(pid, s.tid, "thread_name", "{\"name\":" + quoted("comm " + name + " #" + std::to_string(lane)) + "}"));
      }
    }
    write_line(format_span(s, pid, groups));
  }
  const MemorySample& m = batch.memory;
  if (m.rss_bytes > 0)
    write_line("{\"ph\":\"C\",\"pid\":" + std::to_string(pid) + ",\"tid\":0,\"ts\":" + std::to_string(batch.ts_us) +
               ",\"name\":\"memory\",\"args\":{\"rss_bytes\":" + std::to_string(m.rss_bytes) +
               ",\"peak_rss_bytes\":" + std::to_string(m.peak_rss_bytes) +
               ",\"model_state_bytes\":" + std::to_string(m.model_state_bytes) + "}},");
  if (batch.dropped > 0)
    write_line("{\"ph\":\"C\",\"pid\":" + std::to_string(pid) + ",\"tid\":0,\"ts\":" + std::to_string(batch.ts_us) +
               ",\"name\":\"dropped_events\",\"args\":{\"count\":" + std::to_string(batch.dropped) + "}},");
}

void Tracer::write_line(const std::string& line) {
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fputc('\n', file_);
}

Tracer::Scope::Scope(Tracer* tracer, SpanKind kind, const char* name, int64_t step, int mb, int stage)
    : tracer_(tracer) {
  if (!tracer_) return;
  span_.kind = kind;
  span_.name = name;
  span_.step = step;
  span_.mb = mb;
  span_.stage = stage;
  span_.ts_us = monotonic_us();
}

Tracer::Scope::~Scope() {
  if (!tracer_) return;
  span_.dur_us = monotonic_us() - span_.ts_us;
  tracer_->add(span_);
}

int64_t rss_bytes() {
  std::ifstream in("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  in >> pages >> resident;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

int64_t anonymous_rss_bytes() {
  std::ifstream in("/proc/self/statm");
  int64_t pages = 0, resident = 0, file_backed = 0;
  in >> pages >> resident >> file_backed;
  return (resident - file_backed) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace crosstrain::obs
