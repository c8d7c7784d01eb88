// `crosstrain scheduler` (the daemon: state in SQLite, the HTTP/JSON API of scheduler/service.h) and
// `crosstrain job submit|status|logs|cancel` (its clients), docs/scheduler.md.
#pragma once

#include <cstdint>
#include <string>

namespace CLI {
class App;
}

namespace crosstrain::apps {

// CLI11 keeps pointers into this: do not move it.
struct SchedulerCli {
  CLI::App *serve = nullptr, *submit = nullptr, *status = nullptr, *logs = nullptr, *cancel = nullptr;
  // serve
  std::string state, clusters, host = "127.0.0.1";
  int port = 8650;
  int64_t tick_ms = 100;
  // job *
  std::string server = "http://127.0.0.1:8650", spec, name = "job", model = "gpt-small";
  int ranks = 1;
  int64_t steps = 1000, id = -1;
  double deadline_s = 0, budget = 0, max_wan_gbps = -1;
  bool selected() const;
};

void add_scheduler_commands(CLI::App& app, SchedulerCli& cli);
int run_scheduler_command(const SchedulerCli& cli);

}  // namespace crosstrain::apps
