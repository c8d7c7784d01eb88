// The scheduler's state in one SQLite file, so that a restart (another process, or another StateStore on the same
// file) recovers every cluster, link, job and placement exactly. WAL journal; every change is one transaction;
// synchronous=FULL by default (a commit survives a power cut), NORMAL on request (survives a crash of the process).
//
// Tables (schema version 1, PRAGMA user_version; PRAGMA application_id marks the file as ours):
//   clusters(name, up, spec)            spec: the cluster and its device type as a planner cluster file (TOML)
//   links(a, b, latency_s, bandwidth_Bps)
//   jobs(id, name, spec, state, attempts, step, reason, submitted_s, updated_s)    spec: JSON of JobSpec
//   placements(job_id, attempt, layout, sync, inner_steps, step_s, wan_gbps, cost)
//   placement_shares(job_id, cluster, ranks, layout)
//   events(id, time_s, job_id, kind, detail)
// A file that is not SQLite, an SQLite file of another program, or one written by a newer schema is refused with
// a UsageError naming the path and what to do. Pure: no libtorch.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "crosstrain/scheduler/job.h"

struct sqlite3;

namespace crosstrain::scheduler {

constexpr int kStateSchemaVersion = 4;  // 2: placement_shares.absent; 3: started_s, usage; 4: placements.standby, moved

struct ClusterRow {
  std::string name;
  bool up = true;
  std::string spec_toml;  // a planner cluster file holding this one cluster and its device type
};

struct LinkRow {
  std::string a, b;
  double latency_s = 0, bandwidth_Bps = 0;
};

struct EventRow {
  int64_t id = 0;
  double time_s = 0;
  int64_t job_id = 0;  // 0: not about one job (a cluster lost, ...)
  std::string kind, detail;
};

struct StoreOptions {
  bool synchronous_full = true;
};

class StateStore {
 public:
  // Opens or creates the file. Throws UsageError for a corrupt, foreign or newer file.
  explicit StateStore(const std::string& path, StoreOptions options = {});
  ~StateStore();
  StateStore(const StateStore&) = delete;
  StateStore& operator=(const StateStore&) = delete;

  const std::string& path() const { return path_; }

  // Groups the writes between begin() and commit() into one transaction (nested calls join the outer one). A
  // Transaction that is destroyed without commit() rolls back.
  class Transaction {
   public:
    explicit Transaction(StateStore& store);
    ~Transaction();
    void commit();

   private:
    StateStore& store_;
    bool outer_ = false, done_ = false;
  };

  void put_cluster(const ClusterRow& row);
  void put_link(const LinkRow& row);
  std::vector<ClusterRow> clusters() const;
  std::vector<LinkRow> links() const;

  // Inserts a job (its id is chosen here and returned) with its submission event.
  int64_t add_job(const JobRecord& job);
  // Writes the job's mutable fields (state, attempts, step, reason, updated_s) and its placement: written when
  // present, deleted when absent.
  void update_job(const JobRecord& job);
  void add_event(double time_s, int64_t job_id, const std::string& kind, const std::string& detail);

  std::vector<JobRecord> jobs() const;  // every job with its placement, by id
  std::optional<JobRecord> job(int64_t id) const;
  std::vector<EventRow> events(int64_t job_id = -1) const;  // -1: all
  // Accounting: device-seconds used, by user and cluster, added as jobs give devices back.
  void add_usage(const std::string& user, const std::string& cluster, double device_s);
  struct UsageRow {
    std::string user, cluster;
    double device_s = 0;
  };
  std::vector<UsageRow> usage() const;  // by user, then cluster
  // The newest job id (0 when none).
  int64_t last_job_id() const;

 private:
  friend class Transaction;
  void exec(const char* sql) const;
  void check_schema();
  void create_schema();
  void write_placement(int64_t job_id, const std::optional<PlacementRecord>& placement);
  std::optional<PlacementRecord> read_placement(int64_t job_id) const;
  JobRecord read_job_row(void* stmt) const;

  std::string path_;
  sqlite3* db_ = nullptr;
  int depth_ = 0;  // open transactions (nested ones join the outermost)
};

// Bodies of the API are bounded in size (1 MiB) and in nesting: "" when `text` nests at most `most` objects and
// arrays, else why not (checked before the parser builds anything).
constexpr int kMaxJsonDepth = 16;
std::string json_nesting_error(const std::string& text, int most);

// Why a job's own `set` override may not change `key` (a key the scheduler decides: run.dir, comm.*, ...), or ""
// when it may.
std::string scheduler_owned_key(const std::string& key);
// The first key a recipe's text (TOML) sets that is the scheduler's to decide ("KEY: why"), or "" when none: a key
// the scheduler's own settings override anyway (run.dir, run.fence, run.work_log, obs.metrics_*) may stand, and
// the others only with a neutral value (false, ""). Text that is not TOML is refused too.
std::string recipe_owned_key(const std::string& text);

// JSON of a job spec (the jobs table's spec column; also what the HTTP API will take).
std::string job_spec_to_json(const JobSpec& spec);
JobSpec job_spec_from_json(const std::string& text);  // throws UsageError naming the field

}  // namespace crosstrain::scheduler
