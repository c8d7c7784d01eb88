// `crosstrain scheduler` (the daemon: state in SQLite, the HTTP/JSON API of scheduler/service.h) and
// `crosstrain job submit|status|logs|cancel` (its clients), docs/scheduler.md.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace crosstrain::apps {

// CLI11 keeps pointers into this: do not move it.
struct SchedulerCli {
  CLI::App *serve = nullptr, *submit = nullptr, *status = nullptr, *logs = nullptr, *cancel = nullptr;
  CLI::App *register_cluster = nullptr, *link = nullptr;
  // cluster register FILE | cluster link A B
  std::string cluster_file, link_a, link_b;
  double bandwidth_gbps = 0, latency_us = 0;
  // serve
  std::string state, clusters, host = "127.0.0.1";
  int port = 8650;
  int64_t tick_ms = 0;                // 0: 100 ms for the simulation, 1000 ms for processes and Slurm
  std::string executor = "sim";       // sim, local or slurm
  std::vector<std::string> slurm;     // NAME=SLURM_CONF[:PARTITION], one per cluster of the cluster file
  std::string work_dir;               // jobs' folders (default: beside the state file)
  std::string master_host = "127.0.0.1";
  std::string ledger, ledger_keys;    // recipe jobs sign their clusters' work into this ledger (docs/ledger.md)
  std::string ledger_url;             // where the shares reach it over the API instead (clusters without this disk)
  std::string ledger_ca;              // the certificate they trust for an https ledger_url (a path on the clusters)
  int claim_every_s = 30;
  std::string tokens;                 // API tokens file (default: beside --state, made on the first start)
  std::string cluster_keys;           // clusters' public keys (keys.json): who may register and report links
  std::string tls_cert, tls_key;      // HTTPS; required to listen beyond loopback
  int max_local_ranks = 0;            // --executor local: most ranks of one job (0: two per core)
  bool site_storage = false;          // each cluster has storage of its own (WORK/sites/CLUSTER): run.site
  std::vector<std::string> quotas;    // USER=DEVICES: most devices a user's jobs hold at once
  std::vector<std::string> cluster_hosts;  // CLUSTER=ADDRESS: where that cluster's share nodes are reached
  bool no_preemption = false;
  double move_after_s = 30;
  // job submit: a recipe and its overrides (the model shape, batch and steps then come from the recipe)
  std::string recipe;
  std::vector<std::string> sets;
  int min_ranks = 0, max_restarts = 0, priority = 0;
  std::string user = "default";
  int64_t global_batch = 0, checkpoint_every = 0;
  // job *
  std::string server = "http://127.0.0.1:8650", spec, name = "job", model = "gpt-small";
  std::string token, token_file, ca_cert;  // how a client proves itself, and the CA that signed an HTTPS server
  std::string key;                         // cluster register / link: the cluster's key (NAME.key) signs it
  int ranks = 1;
  int64_t steps = 0, id = -1;  // steps 0: the recipe's, else 1000
  double deadline_s = 0, budget = 0, max_wan_gbps = -1;
  bool selected() const;
};

void add_scheduler_commands(CLI::App& app, SchedulerCli& cli);
int run_scheduler_command(const SchedulerCli& cli);

}  // namespace crosstrain::apps
