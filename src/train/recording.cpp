#include "crosstrain/train/recording.h"

#include <chrono>
#include <filesystem>
#include <string>

#include "crosstrain/comm/diagnostics/clock_sync.h"
#include "crosstrain/comm/diagnostics/hang_doctor.h"
#include "crosstrain/comm/diagnostics/recording.h"
#include "crosstrain/obs/metrics.h"
#include "crosstrain/train/debug_fault.h"

namespace crosstrain::train {
namespace fs = std::filesystem;

namespace {

comm::RecordingOptions recording_options(const Config& c, int rank, comm::HangDoctor* doctor,
                                         std::shared_ptr<comm::FlightRecorder> recorder) {
  comm::RecordingOptions o;
  o.recorder = std::move(recorder);
  o.doctor = doctor;
  // debug.skip_collective = "RANK@STEP": the step at which this rank holds back a collective.
  o.hold_back_step = parse_debug_fault(c.debug.skip_collective, "skip_collective").step_for(rank);
  return o;
}

obs::Span wait_span(const comm::OpRecord& r, int group, int64_t from_us, int64_t to_us) {
  obs::Span wait;
  wait.kind = obs::SpanKind::Wait;
  wait.name = "wait";
  wait.op = r.op;
  wait.ts_us = from_us;
  wait.dur_us = to_us - from_us;
  wait.step = r.step;
  wait.group = group;
  wait.seq = r.seq;
  return wait;
}

// A finished operation of the recorded communicators: its span from issue to completion (on a lane of its
// group), and the parts a thread spent blocked on it: in the call that issued it (some paths do their work
// there), then in its wait. Waits too short to matter are left out to keep traces small.
void trace_operation(obs::Tracer& tracer, comm::FlightRecorder& recorder, const comm::OpRecord& r) {
  obs::Span span;
  span.kind = obs::SpanKind::Comm;
  span.name = r.op;
  span.ts_us = r.issued_us;
  span.dur_us = std::max<int64_t>(0, r.finished_us - r.issued_us);
  span.step = r.step;
  span.peer = r.peer;
  span.group = tracer.group(recorder.group_name(r.group));
  span.seq = r.seq;
  span.bytes = r.bytes;
  span.state = comm::to_string(r.state);
  tracer.add(span);
  if (r.issue_end_us - r.issued_us >= 20) tracer.add(wait_span(r, span.group, r.issued_us, r.issue_end_us));
  if (r.wait_start_us >= 0 && r.finished_us - r.wait_start_us >= 5)
    tracer.add(wait_span(r, span.group, r.wait_start_us, r.finished_us));
}

}  // namespace

RunRecording::RunRecording(const Config& c, comm::Communicator& world, comm::HangDoctor* doctor)
    : c_(c), recorder_(std::make_shared<comm::FlightRecorder>(world.rank(), static_cast<size_t>(c.obs.flight_records))),
      world_(comm::make_recording(world, recording_options(c, world.rank(), doctor, recorder_))) {
  if (doctor) doctor->watch(recorder_);
}

RunRecording::~RunRecording() {
  // Works of a failed generation may finish later: they must not reach a tracer that is gone.
  recorder_->set_sink({});
}

// Traces (docs/observability.md): the clock offset to rank 0 first, then every finished operation of the
// recorded communicators becomes a span, and so does every wait a thread spent on one.
void RunRecording::start_trace(obs::TraceIdentity id, bool append) {
  if (!c_.obs.trace) return;
  const comm::ClockOffset clock = world_->size() > 1 ? comm::estimate_clock_offset(*world_) : comm::ClockOffset{};
  id.rank = world_->rank();
  id.world_size = world_->size();
  id.offset_us = clock.offset_us;
  id.rtt_us = clock.rtt_us;
  id.unix_us = std::chrono::duration_cast<std::chrono::microseconds>(
                   std::chrono::system_clock::now().time_since_epoch()).count() - comm::monotonic_us();
  const std::string path = (fs::path(c_.run.dir) / "traces" / ("rank-" + std::to_string(world_->rank()) + ".json")).string();
  tracer_ = std::make_shared<obs::Tracer>(path, id, static_cast<size_t>(c_.obs.trace_buffer_events), append);
  // The sink holds the tracer: a work another thread finishes while this recording is destroyed still has it.
  // The recorder is the one calling, so it is alive.
  comm::FlightRecorder* recorder = recorder_.get();
  recorder_->set_sink([tracer = tracer_, recorder](const comm::OpRecord& r) { trace_operation(*tracer, *recorder, r); });
}

void RunRecording::flush_trace(int64_t model_state_bytes) {
  if (!tracer_) return;
  obs::MemorySample m;
  m.rss_bytes = obs::rss_bytes();
  m.peak_rss_bytes = obs::peak_rss_bytes();
  m.model_state_bytes = model_state_bytes;
  tracer_->flush(m);
}

}  // namespace crosstrain::train
