// A communicator in front of another that records every operation in a flight recorder (flight_recorder.h):
// sequence numbers per group, the time each was issued and finished, the time threads spent blocked in waits.
// On a timeout it asks the hang doctor (hang_doctor.h), when there is one, which ranks never got there, and
// adds the answer to the error. Sub-groups from split() are recorded too.
#pragma once

#include <memory>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/comm/diagnostics/flight_recorder.h"

namespace crosstrain::comm {

class HangDoctor;

struct RecordingOptions {
  std::shared_ptr<FlightRecorder> recorder;  // required
  HangDoctor* doctor = nullptr;              // optional: diagnose timeouts through the control plane
  int64_t hold_back_step = -1;               // debug.skip_collective: at this step the first collective is held back
};

// `world` must outlive the returned communicator (it is not owned). Its rank r is global rank r.
std::unique_ptr<Communicator> make_recording(Communicator& world, RecordingOptions options);

}  // namespace crosstrain::comm
