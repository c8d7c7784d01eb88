// `crosstrain run`: starts the ranks of one node, torchrun style.
#pragma once

#include <chrono>
#include <csignal>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "launch_limits.h"

#include "elastic_supervisor.h"

namespace crosstrain::apps {

struct LaunchOptions {
  int nproc = 1;                       // ranks on this node
  int nnodes = 1;
  int node_rank = 0;
  // --node-sizes: the ranks of every node in node-rank order, when they differ (a scheduler's uneven shares);
  // empty: nproc on every node. This node's entry is nproc.
  std::vector<int> node_sizes;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;                 // 0: a free port (single node only); 29500 when several nodes
  std::vector<std::string> command;    // program and arguments run once per rank
  std::chrono::milliseconds stop_grace{3000};   // SIGTERM, then SIGKILL after this long
  // What the others get when a rank fails. crosstrain's own training ranks take SIGTERM as a request to stop after
  // their next step (a batch system's warning); a peer's failure must end them now, so launch_self sends SIGKILL.
  int peer_failure_signal = SIGTERM;
  std::chrono::milliseconds signal_grace{30000};  // after a forwarded SIGINT/SIGTERM (a second one kills at once)
  std::chrono::milliseconds timeout{30000};     // rendezvous store
  std::map<std::string, std::string> extra_env;
  std::string secret;                  // the job secret ("": CROSSTRAIN_SECRET, if set); passed in the environment
  std::string job_id;                  // "": CROSSTRAIN_JOB_ID / TORCHELASTIC_RUN_ID, else made up (one node)
  ElasticLaunch elastic;               // restart failed ranks, run the membership coordinator (node 0)
  // --standby HOST:PORT (elastic, several nodes): node 1's launcher hosts a second store there, and its
  // coordinator takes over when node 0 is lost; every rank learns the address (CROSSTRAIN_STANDBY).
  std::string standby_addr;
  int standby_port = 0;
  // --rejoin (node 0, elastic): node 0 started again after the standby took over: it hosts no store and joins the
  // running job at --master, which is then the standby's address, like any other node.
  bool rejoin = false;
  int rank_nice = 0;                   // set by launch(): the priority ranks run at (the launcher's own at start)
  bool prefix_output = true;           // "[rank N] " before each line
  bool prefix_rank0_stdout = true;     // off when rank 0 prints a report (bench, train)
  RankNeeds rank_needs;                // checked against the machine before anything starts
};

// Parses "HOST:PORT" (IPv6 as "[::1]:PORT") given to `option` (--master, --standby); throws UsageError.
void parse_master(const std::string& text, std::string& host, int& port, const std::string& option = "--master");

// The job's ranks (the sum of node_sizes, else nproc x nnodes) and this node's first rank.
int world_of(const LaunchOptions& options);
int first_rank_of(const LaunchOptions& options);
// "2,1,1" -> {2, 1, 1}; throws UsageError naming --node-sizes unless every entry is a positive integer.
std::vector<int> parse_node_sizes(const std::string& text);

// Hosts the rendezvous store on node 0, runs the ranks with prefixed output, forwards SIGINT/SIGTERM,
// and stops every rank when one fails. Returns the exit code for the launcher: 0, or the failed rank's.
int launch(const LaunchOptions& options);

// Runs this very binary with `args` as nproc local ranks; `extra_bytes_per_rank` adds to a bare rank's memory
// (the model state a training rank holds at the least); `signal_grace`: how long the ranks may take to stop after
// a forwarded SIGINT or SIGTERM (a DiLoCo run stops at its next outer step).
int launch_self(int nproc, const std::vector<std::string>& args,
                std::chrono::milliseconds timeout = std::chrono::milliseconds(30000), int64_t extra_bytes_per_rank = 0,
                const std::string& secret = "", const ElasticLaunch& elastic = {},
                std::chrono::milliseconds signal_grace = std::chrono::milliseconds(30000));

}  // namespace crosstrain::apps
