// The hang doctor: asks every rank of the job, through the control plane (the rendezvous store), how far it got,
// when one of this rank's operations timed out, and turns the answers into one line for the error
// (flight_recorder.h: diagnose_hang). Every rank runs one; its thread answers the others' questions even while
// the training thread is stuck.
//
// Keys (under the job's prefix): obs/diag/req/<n> (a question, numbered by the counter obs/diag/requests) and
// obs/diag/ans/<n>/<rank> (each rank's RankStatus as JSON).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/comm/diagnostics/flight_recorder.h"
#include "crosstrain/comm/rendezvous.h"
#include "crosstrain/core/launch_env.h"

namespace crosstrain::comm {

class HangDoctor {
 public:
  // Connects to the job's store as a tool (it claims no rank) and starts answering the others' questions.
  // `answer_within`: how long a diagnosis waits for the others' answers.
  HangDoctor(const LaunchEnv& env, Millis answer_within, Millis timeout);
  ~HangDoctor();
  HangDoctor(const HangDoctor&) = delete;
  HangDoctor& operator=(const HangDoctor&) = delete;

  // Asks every rank and returns the diagnosis line of `stuck` (an operation of `group`, whose members are
  // global ranks). Never throws: a failure to ask becomes part of the line.
  std::string diagnose(const OpRecord& stuck, const std::string& group, const std::vector<int>& members);
  // The recorder whose status this rank gives (each run of the process has its own; none: "starting").
  void watch(std::shared_ptr<FlightRecorder> recorder);

 private:
  void answer_loop();
  c10::intrusive_ptr<c10d::Store> reconnect();
  RankStatus status() const;

  LaunchEnv env_;
  Millis timeout_;
  int rank_, world_size_;
  mutable std::mutex mu_;
  std::shared_ptr<FlightRecorder> recorder_;
  Millis answer_within_;
  std::shared_ptr<Rendezvous> asking_, answering_;  // one connection per thread
  std::atomic<bool> stop_{false};
  std::thread answerer_;
};

}  // namespace crosstrain::comm
