// The service layer of the compute network (ITU-T Y.2501): an HTTP/JSON API over the scheduler, and the loop that
// drives it. One mutex guards the scheduler: requests and the periodic tick take turns.
//
//   GET    /api/health               {"ok": true, "jobs": N, "queued": N}
//   GET    /                         the dashboard (dashboard.h)
//   GET    /api/clusters             {"clusters": [devices, free, up, price, power], "links": [a, b, bandwidth, latency]}
//   GET    /api/jobs                 every job: id, name, state, ranks, attempts, step, reason, placement
//   GET    /api/jobs/ID              one job
//   GET    /api/jobs/ID/events       its events (submitted, placed, started, re-placed, ...), oldest first
//   POST   /api/jobs                 a job spec (JSON, state_store.h) -> {"id": N, "state": ...}; 400 with the reason
//   DELETE /api/jobs/ID              cancel
// Errors are JSON too: {"error": "..."} with 400 (bad request), 404 (no such job) or 500.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "crosstrain/scheduler/scheduler.h"
#include "crosstrain/scheduler/state_store.h"

namespace httplib {
class Server;
}

namespace crosstrain::scheduler {

class SchedulerService {
 public:
  // Serves on host:port (port 0: any free one, see port()) and ticks the scheduler every `tick_every`.
  SchedulerService(Scheduler& scheduler, StateStore& store, const std::string& host, int port,
                   std::chrono::milliseconds tick_every);
  ~SchedulerService();
  SchedulerService(const SchedulerService&) = delete;
  SchedulerService& operator=(const SchedulerService&) = delete;

  int port() const { return port_; }
  // Stops serving and ticking (the destructor does it too).
  void stop();
  // Blocks until stop() (from a signal handler's thread, or another thread).
  void wait();

 private:
  void routes();
  void tick_loop();

  Scheduler& scheduler_;
  StateStore& store_;
  std::unique_ptr<httplib::Server> server_;
  std::mutex mutex_;  // the scheduler and the store
  std::chrono::milliseconds tick_every_;
  int port_ = 0;
  bool stopping_ = false;
  std::mutex stop_mutex_;
  std::condition_variable stopped_;
  std::thread http_, ticker_;
};

// JSON of a job as the API returns it.
std::string job_to_json(const JobRecord& job);

}  // namespace crosstrain::scheduler
