// Private to src/train: what a rank records of its run, whatever the model family.
//
// Every operation of a job goes through the recorded world (comm/diagnostics/recording.h): the flight recorder knows what
// each rank is doing (a peer's hang diagnosis reads it), and with obs.trace every finished operation, and every
// wait on one, becomes a span of RUN_DIR/traces/rank-R.json beside the phases the job marks (Phase).
#pragma once

#include <memory>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/comm/diagnostics/flight_recorder.h"
#include "crosstrain/obs/trace.h"
#include "crosstrain/train/config.h"

namespace crosstrain::comm {
class HangDoctor;  // comm/diagnostics/hang_doctor.h
}

namespace crosstrain::train {

class RunRecording {
 public:
  // `doctor` (may be null) watches this rank's flight recorder and asks the others when a collective times out.
  RunRecording(const Config& c, comm::Communicator& world, comm::HangDoctor* doctor);
  ~RunRecording();
  RunRecording(const RunRecording&) = delete;
  RunRecording& operator=(const RunRecording&) = delete;

  comm::Communicator& world() { return *world_; }
  comm::FlightRecorder& recorder() { return *recorder_; }
  obs::Tracer* tracer() { return tracer_.get(); }  // null without obs.trace
  // Collective over world(): the clock offset to rank 0 first. `identity` says where this rank sits in the
  // layout (rank, offsets and clocks are filled here). `append`: a resumed run or a later elastic generation adds
  // to the file; a fresh run starts it over.
  void start_trace(obs::TraceIdentity identity, bool append);
  // Appends the buffered spans with a memory sample.
  void flush_trace(int64_t model_state_bytes);

 private:
  const Config& c_;
  std::shared_ptr<comm::FlightRecorder> recorder_;
  std::unique_ptr<comm::Communicator> world_;
  std::shared_ptr<obs::Tracer> tracer_;  // shared with the recorder's sink, which other threads may be in
};

// A phase of the training thread: a span in the trace and, while it lasts, what the flight recorder says this
// rank is doing.
class Phase {
 public:
  Phase(obs::Tracer* tracer, comm::FlightRecorder& recorder, obs::SpanKind kind, const char* name, int64_t step,
        int mb = -1, int stage = -1)
      : scope_(tracer, kind, name, step, mb, stage), recorder_(recorder), outer_(recorder.activity()) {
    recorder_.set_activity(name);
  }
  Phase(RunRecording& r, obs::SpanKind kind, const char* name, int64_t step)
      : Phase(r.tracer(), r.recorder(), kind, name, step) {}
  ~Phase() { recorder_.set_activity(outer_); }
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  obs::Tracer::Scope scope_;
  comm::FlightRecorder& recorder_;
  const char* outer_;
};

}  // namespace crosstrain::train
