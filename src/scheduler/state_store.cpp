#include "crosstrain/scheduler/state_store.h"

#include <toml++/toml.h>

#include <sqlite3.h>

#include <nlohmann/json.hpp>

#include "crosstrain/core/error.h"
#include "crosstrain/core/names.h"

namespace crosstrain::scheduler {
namespace {

constexpr size_t kMaxRecipeBytes = 256 << 10;  // a recipe is a small TOML file; the spec travels in one request
constexpr int kMaxJobRanks = 1 << 24;  // far beyond any cluster: a job wanting more is malformed, not merely too big

// "CTSC": marks the file as a crosstrain scheduler state (PRAGMA application_id).
constexpr int kApplicationId = 0x43545343;

// One prepared statement; binds by position (1-based), steps, finalizes on destruction.
class Statement {
 public:
  Statement(sqlite3* db, const char* sql, const std::string& path) : db_(db), path_(path) {
    if (sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr) != SQLITE_OK) fail("prepare");
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement& bind(int i, int64_t v) { return check(sqlite3_bind_int64(stmt_, i, v)); }
  Statement& bind(int i, int v) { return check(sqlite3_bind_int64(stmt_, i, v)); }
  Statement& bind(int i, double v) { return check(sqlite3_bind_double(stmt_, i, v)); }
  Statement& bind(int i, const std::string& v) {
    return check(sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT));
  }
  // True while a row is available.
  bool step() {
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc != SQLITE_DONE) fail("step");
    return false;
  }
  int64_t integer(int col) const { return sqlite3_column_int64(stmt_, col); }
  double real(int col) const { return sqlite3_column_double(stmt_, col); }
  std::string text(int col) const {
    const unsigned char* t = sqlite3_column_text(stmt_, col);
    return t ? reinterpret_cast<const char*>(t) : "";
  }
  sqlite3_stmt* raw() { return stmt_; }

 private:
  Statement& check(int rc) {
    if (rc != SQLITE_OK) fail("bind");
    return *this;
  }
  [[noreturn]] void fail(const char* what) const {
    throw Error("scheduler state '" + path_ + "': " + what + ": " + sqlite3_errmsg(db_));
  }
  sqlite3* db_;
  const std::string& path_;
  sqlite3_stmt* stmt_ = nullptr;
};

const char* kSchema = R"(
CREATE TABLE clusters(name TEXT PRIMARY KEY, up INTEGER NOT NULL, spec TEXT NOT NULL);
CREATE TABLE links(a TEXT NOT NULL, b TEXT NOT NULL, latency_s REAL NOT NULL, bandwidth_Bps REAL NOT NULL,
                   PRIMARY KEY(a, b));
CREATE TABLE jobs(id INTEGER PRIMARY KEY, name TEXT NOT NULL, spec TEXT NOT NULL, state TEXT NOT NULL,
                  attempts INTEGER NOT NULL, step INTEGER NOT NULL, reason TEXT NOT NULL,
                  submitted_s REAL NOT NULL, updated_s REAL NOT NULL);
CREATE INDEX jobs_state ON jobs(state);
CREATE TABLE placements(job_id INTEGER PRIMARY KEY REFERENCES jobs(id), attempt INTEGER NOT NULL,
                        layout TEXT NOT NULL, sync TEXT NOT NULL, inner_steps INTEGER NOT NULL,
                        step_s REAL NOT NULL, wan_gbps REAL NOT NULL, cost REAL NOT NULL,
                        standby INTEGER NOT NULL DEFAULT 0, moved INTEGER NOT NULL DEFAULT 0);
CREATE TABLE placement_shares(job_id INTEGER NOT NULL REFERENCES jobs(id), position INTEGER NOT NULL,
                              cluster TEXT NOT NULL, ranks INTEGER NOT NULL, layout TEXT NOT NULL,
                              absent INTEGER NOT NULL DEFAULT 0, started_s REAL NOT NULL DEFAULT -1,
                              PRIMARY KEY(job_id, position));
CREATE TABLE usage(user TEXT NOT NULL, cluster TEXT NOT NULL, device_s REAL NOT NULL, PRIMARY KEY(user, cluster));
CREATE TABLE events(id INTEGER PRIMARY KEY AUTOINCREMENT, time_s REAL NOT NULL, job_id INTEGER NOT NULL,
                    kind TEXT NOT NULL, detail TEXT NOT NULL);
CREATE INDEX events_job ON events(job_id);
)";

nlohmann::json shape_json(const planner::ModelShape& m) {
  return {{"name", m.name},   {"arch", models::to_string(m.arch)}, {"layers", m.layers}, {"hidden", m.hidden},
          {"heads", m.heads}, {"kv_heads", m.kv_heads},             {"ffn", m.ffn},       {"vocab", m.vocab},
          {"seq", m.seq},     {"tied_embeddings", m.tied_embeddings}};
}

template <typename T>
void read(const nlohmann::json& j, const char* key, T& out, const std::string& where) {
  if (!j.contains(key)) return;  // keeps the default
  try {
    out = j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw UsageError("job spec: " + where + key + " has the wrong type (" + j.at(key).dump() + ")");
  }
}

}  // namespace

std::string job_spec_to_json(const JobSpec& s) {
  nlohmann::json j = {{"name", s.name},         {"model", shape_json(s.model)},
                      {"ranks", s.ranks},       {"global_batch", s.global_batch},
                      {"steps", s.steps},       {"checkpoint_every", s.checkpoint_every},
                      {"qos", {{"deadline_s", s.qos.deadline_s}, {"budget", s.qos.budget},
                               {"max_wan_gbps", s.qos.max_wan_gbps}}}};
  if (s.min_ranks > 0) j["min_ranks"] = s.min_ranks;
  if (s.max_restarts > 0) j["max_restarts"] = s.max_restarts;
  if (s.user != "default") j["user"] = s.user;
  if (s.priority != 0) j["priority"] = s.priority;
  if (!s.recipe.empty()) j["recipe"] = s.recipe;
  if (!s.recipe_text.empty()) j["recipe_text"] = s.recipe_text;
  if (!s.overrides.empty()) j["set"] = s.overrides;
  return j.dump();
}

std::string scheduler_owned_key(const std::string& key) {
  // Where the job writes and listens, what it trusts, and test-only faults are the scheduler's to decide: a
  // submitter's override could otherwise write into another job's folder, open a port, turn encryption off or
  // point the job at another secret.
  static const std::vector<std::pair<std::string, std::string>> owned{
      {"run.dir", "the scheduler puts each job's run folder under its --work-dir"},
      {"run.secret_file", "the scheduler gives every job a secret of its own"},
      {"run.fence", "the scheduler fences each placement's run folder"},
      {"run.work_log", "the scheduler turns work logs on for ledger jobs"},
      {"comm.encrypt", "the scheduler decides whether a job's links are sealed"},
      {"comm.identity", "the scheduler gives each share its cluster's key"},
      {"comm.peer_keys", "the scheduler gives each share the clusters' keys"},
      {"comm.topology", "a file the job would read as the daemon's user; the scheduler knows the clusters"},
      {"sync.topology", "the scheduler places the shares and tells each its cluster"},
      {"obs.metrics_", "a job's metrics endpoint stays on the scheduler's terms (loopback)"},
      {"debug.", "fault injection is for tests, not for jobs"},
  };
  for (const auto& [prefix, why] : owned)
    if (key == prefix || (prefix.back() == '.' || prefix.back() == '_' ? key.rfind(prefix, 0) == 0 : false))
      return why + "; remove it from the job's overrides";
  return "";
}

namespace {

// Each leaf of a TOML table as "section.key" with its node.
void leaves(const toml::table& table, const std::string& prefix,
            std::vector<std::pair<std::string, const toml::node*>>& out) {
  for (const auto& [key, node] : table) {
    const std::string name = prefix + std::string(key.str());
    if (const toml::table* inner = node.as_table()) leaves(*inner, name + ".", out);
    else out.emplace_back(name, &node);
  }
}

}  // namespace

std::string recipe_owned_key(const std::string& text) {
  if (text.empty()) return "";
  toml::table table;
  try {
    table = toml::parse(text);
  } catch (const toml::parse_error& e) {
    return "no TOML the ranks could read (" + std::string(e.description()) + ")";
  }
  std::vector<std::pair<std::string, const toml::node*>> keys;
  leaves(table, "", keys);
  // The scheduler's own settings come after the recipe and win for these; elsewhere only a neutral value (off,
  // empty) may stand in a recipe, as the bundled recipes have them.
  static const std::vector<std::string> overridden{"run.dir", "run.fence", "run.work_log", "obs.metrics_"};
  for (const auto& [key, node] : keys) {
    // An array where a section belongs ([[debug]]) is judged as that section.
    std::string why = scheduler_owned_key(key);
    if (why.empty() && node->is_array()) why = scheduler_owned_key(key + ".");
    if (why.empty()) continue;
    bool wins = false;
    for (const std::string& o : overridden) wins = wins || key == o || (o.back() == '_' && key.rfind(o, 0) == 0);
    const bool neutral = (node->is_boolean() && !node->value<bool>().value_or(true)) ||
                         (node->is_string() && node->value<std::string>().value_or("x").empty());
    if (!wins && !neutral) return key + ": " + why.substr(0, why.find(';')) + "; take it out of the recipe";
  }
  return "";
}

std::string json_nesting_error(const std::string& text, int most) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > most)
        return "JSON nested deeper than " + std::to_string(most) + " levels (a job spec needs 2)";
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return "";
}

JobSpec job_spec_from_json(const std::string& text) {
  if (const std::string deep = json_nesting_error(text, kMaxJsonDepth); !deep.empty())
    throw UsageError("job spec: " + deep);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(std::string("job spec is not JSON: ") + e.what());
  }
  if (!j.is_object()) throw UsageError("job spec must be a JSON object");
  JobSpec s;
  read(j, "name", s.name, "");
  read(j, "ranks", s.ranks, "");
  read(j, "global_batch", s.global_batch, "");
  read(j, "steps", s.steps, "");
  read(j, "checkpoint_every", s.checkpoint_every, "");
  read(j, "min_ranks", s.min_ranks, "");
  read(j, "max_restarts", s.max_restarts, "");
  if (s.max_restarts < 0) throw UsageError("job spec: max_restarts = " + std::to_string(s.max_restarts) + " must be 0 or more");
  read(j, "user", s.user, "");
  read(j, "priority", s.priority, "");
  check_name("job spec: user", s.user);
  if (s.priority < -kMaxPriority || s.priority > kMaxPriority)
    throw UsageError("job spec: priority = " + std::to_string(s.priority) + " must be between " +
                     std::to_string(-kMaxPriority) + " and " + std::to_string(kMaxPriority));
  read(j, "recipe", s.recipe, "");
  read(j, "recipe_text", s.recipe_text, "");
  if (s.recipe_text.size() > kMaxRecipeBytes)
    throw UsageError("job spec: recipe_text of " + std::to_string(s.recipe_text.size()) + " bytes; a recipe is at most " +
                     std::to_string(kMaxRecipeBytes) + " (its data and weights go by path, not in the recipe)");
  if (!s.recipe_text.empty() && s.recipe.empty())
    throw UsageError("job spec: recipe_text without recipe (the recipe's file name, which the ranks' copy keeps)");
  if (const std::string owned = recipe_owned_key(s.recipe_text); !owned.empty())
    throw UsageError("job spec: the recipe sets " + owned);
  read(j, "set", s.overrides, "");
  for (const std::string& o : s.overrides) {
    if (o.find('=') == std::string::npos || o.front() == '=')
      throw UsageError("job spec: set entry '" + o + "' is not KEY=VALUE (as crosstrain train --set)");
    const std::string why = scheduler_owned_key(o.substr(0, o.find('=')));
    if (!why.empty()) throw UsageError("job spec: set entry '" + o + "': " + why);
  }
  if (s.min_ranks < 0 || s.min_ranks > s.ranks)
    throw UsageError("job spec: min_ranks = " + std::to_string(s.min_ranks) + " must be between 1 and ranks = " +
                     std::to_string(s.ranks) + " (0: exactly ranks)");
  if (j.contains("model")) {
    const nlohmann::json& m = j.at("model");
    if (m.is_string()) {
      s.model = planner::model_preset(m.get<std::string>());
    } else {
      read(m, "name", s.model.name, "model.");
      std::string arch = models::to_string(s.model.arch);  // the recipe's word, as the spec stores it
      read(m, "arch", arch, "model.");
      s.model.arch = models::parse_model_arch(arch);
      read(m, "layers", s.model.layers, "model."), read(m, "hidden", s.model.hidden, "model.");
      read(m, "heads", s.model.heads, "model."), read(m, "kv_heads", s.model.kv_heads, "model.");
      read(m, "ffn", s.model.ffn, "model."), read(m, "vocab", s.model.vocab, "model.");
      read(m, "seq", s.model.seq, "model."), read(m, "tied_embeddings", s.model.tied_embeddings, "model.");
    }
  }
  // Checked before anything uses them: a name goes into paths and scripts; a shape with heads = 0 divided by zero
  // in the placement and took the daemon down.
  if (!s.name.empty()) check_name("job spec: name", s.name);
  if (s.ranks < 1 || s.ranks > kMaxJobRanks)
    throw UsageError("job spec: ranks = " + std::to_string(s.ranks) + " must be between 1 and " + std::to_string(kMaxJobRanks));
  if (s.global_batch < 0 || s.steps < 0 || s.checkpoint_every < 0)
    throw UsageError("job spec: global_batch, steps and checkpoint_every must be 0 or more");
  s.model.validate();
  if (j.contains("qos")) {
    const nlohmann::json& q = j.at("qos");
    read(q, "deadline_s", s.qos.deadline_s, "qos."), read(q, "budget", s.qos.budget, "qos.");
    read(q, "max_wan_gbps", s.qos.max_wan_gbps, "qos.");
  }
  return s;
}

StateStore::StateStore(const std::string& path, StoreOptions options) : path_(path) {
  if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                      nullptr) != SQLITE_OK) {
    const std::string why = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    throw UsageError("cannot open scheduler state '" + path + "': " + why + " (check the directory exists and is writable)");
  }
  sqlite3_busy_timeout(db_, 5000);
  try {
    check_schema();
    exec("PRAGMA journal_mode=WAL");
    exec(options.synchronous_full ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL");
    exec("PRAGMA foreign_keys=ON");
  } catch (...) {
    sqlite3_close(db_);
    throw;
  }
}

StateStore::~StateStore() { sqlite3_close(db_); }

void StateStore::exec(const char* sql) const {
  char* error = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &error) != SQLITE_OK) {
    const std::string why = error ? error : sqlite3_errmsg(db_);
    sqlite3_free(error);
    throw Error("scheduler state '" + path_ + "': " + why);
  }
}

void StateStore::check_schema() {
  // Reading the header is where a file that is not SQLite (or is damaged) shows itself.
  int app = 0, version = 0, tables = 0;
  try {
    Statement a(db_, "PRAGMA application_id", path_);
    if (a.step()) app = static_cast<int>(a.integer(0));
    Statement v(db_, "PRAGMA user_version", path_);
    if (v.step()) version = static_cast<int>(v.integer(0));
    Statement t(db_, "SELECT count(*) FROM sqlite_master", path_);
    if (t.step()) tables = static_cast<int>(t.integer(0));
  } catch (const Error& e) {
    throw UsageError("'" + path_ + "' is not a crosstrain scheduler state (" + e.what() +
                     "); move it away or give another state file");
  }
  if (tables == 0 && app == 0) return create_schema();
  if (app != kApplicationId)
    throw UsageError("'" + path_ + "' is an SQLite file of another program (application_id " + std::to_string(app) +
                     "), not a crosstrain scheduler state; give another state file");
  if (version > kStateSchemaVersion)
    throw UsageError("scheduler state '" + path_ + "' has schema version " + std::to_string(version) +
                     ", newer than this crosstrain (" + std::to_string(kStateSchemaVersion) + "); run a newer crosstrain");
  if (version < 1) throw UsageError("scheduler state '" + path_ + "' has no schema version; it is damaged");
  if (version < 2) {
    // Version 1 had no absent shares: every share of a placement ran.
    Transaction t(*this);
    exec("ALTER TABLE placement_shares ADD COLUMN absent INTEGER NOT NULL DEFAULT 0");
    exec("PRAGMA user_version=2");
    t.commit();
  }
  if (version < 3) {
    // Version 2 kept no accounting: usage starts now (a share's start time is not known until it starts again).
    Transaction t(*this);
    exec("ALTER TABLE placement_shares ADD COLUMN started_s REAL NOT NULL DEFAULT -1");
    exec("CREATE TABLE usage(user TEXT NOT NULL, cluster TEXT NOT NULL, device_s REAL NOT NULL, "
         "PRIMARY KEY(user, cluster))");
    exec("PRAGMA user_version=3");
    t.commit();
  }
  if (version < 4) {
    // Version 3 had no standby stores: share 0's loss re-placed the job.
    Transaction t(*this);
    exec("ALTER TABLE placements ADD COLUMN standby INTEGER NOT NULL DEFAULT 0");
    exec("ALTER TABLE placements ADD COLUMN moved INTEGER NOT NULL DEFAULT 0");
    exec("PRAGMA user_version=4");
    t.commit();
  }
}

void StateStore::create_schema() {
  Transaction t(*this);
  exec(kSchema);
  exec(("PRAGMA application_id=" + std::to_string(kApplicationId)).c_str());
  exec(("PRAGMA user_version=" + std::to_string(kStateSchemaVersion)).c_str());
  t.commit();
}

StateStore::Transaction::Transaction(StateStore& store) : store_(store) {
  outer_ = store_.depth_++ == 0;
  if (outer_) store_.exec("BEGIN IMMEDIATE");
}

StateStore::Transaction::~Transaction() {
  if (!done_ && outer_) {
    try {
      store_.exec("ROLLBACK");
    } catch (...) {
    }
  }
  if (!done_) --store_.depth_;
}

void StateStore::Transaction::commit() {
  if (done_) return;
  done_ = true;
  --store_.depth_;
  if (outer_) store_.exec("COMMIT");
}

void StateStore::put_cluster(const ClusterRow& row) {
  Statement s(db_, "INSERT OR REPLACE INTO clusters(name, up, spec) VALUES(?, ?, ?)", path_);
  s.bind(1, row.name).bind(2, row.up ? 1 : 0).bind(3, row.spec_toml).step();
}

void StateStore::put_link(const LinkRow& row) {
  Statement s(db_, "INSERT OR REPLACE INTO links(a, b, latency_s, bandwidth_Bps) VALUES(?, ?, ?, ?)", path_);
  s.bind(1, row.a).bind(2, row.b).bind(3, row.latency_s).bind(4, row.bandwidth_Bps).step();
}

std::vector<ClusterRow> StateStore::clusters() const {
  std::vector<ClusterRow> out;
  Statement s(db_, "SELECT name, up, spec FROM clusters ORDER BY rowid", path_);
  while (s.step()) out.push_back({s.text(0), s.integer(1) != 0, s.text(2)});
  return out;
}

std::vector<LinkRow> StateStore::links() const {
  std::vector<LinkRow> out;
  Statement s(db_, "SELECT a, b, latency_s, bandwidth_Bps FROM links ORDER BY rowid", path_);
  while (s.step()) out.push_back({s.text(0), s.text(1), s.real(2), s.real(3)});
  return out;
}

int64_t StateStore::add_job(const JobRecord& job) {
  Transaction t(*this);
  Statement s(db_,
              "INSERT INTO jobs(name, spec, state, attempts, step, reason, submitted_s, updated_s) "
              "VALUES(?, ?, ?, ?, ?, ?, ?, ?)",
              path_);
  s.bind(1, job.spec.name).bind(2, job_spec_to_json(job.spec)).bind(3, std::string(to_string(job.state)));
  s.bind(4, job.attempts).bind(5, job.step).bind(6, job.reason).bind(7, job.submitted_s).bind(8, job.updated_s);
  s.step();
  const int64_t id = sqlite3_last_insert_rowid(db_);
  write_placement(id, job.placement);
  add_event(job.submitted_s, id, "submitted", job.spec.name);
  t.commit();
  return id;
}

void StateStore::update_job(const JobRecord& job) {
  Transaction t(*this);
  Statement s(db_, "UPDATE jobs SET state = ?, attempts = ?, step = ?, reason = ?, updated_s = ? WHERE id = ?", path_);
  s.bind(1, std::string(to_string(job.state))).bind(2, job.attempts).bind(3, job.step).bind(4, job.reason);
  s.bind(5, job.updated_s).bind(6, job.id).step();
  if (sqlite3_changes(db_) != 1) throw Error("scheduler state '" + path_ + "': no job " + std::to_string(job.id));
  write_placement(job.id, job.placement);
  t.commit();
}

void StateStore::write_placement(int64_t job_id, const std::optional<PlacementRecord>& p) {
  Statement(db_, "DELETE FROM placement_shares WHERE job_id = ?", path_).bind(1, job_id).step();
  Statement(db_, "DELETE FROM placements WHERE job_id = ?", path_).bind(1, job_id).step();
  if (!p) return;
  Statement s(db_,
              "INSERT INTO placements(job_id, attempt, layout, sync, inner_steps, step_s, wan_gbps, cost, standby, "
              "moved) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
              path_);
  // The sync as its word (the layout's own), so older databases and the dashboard read the same text.
  s.bind(1, job_id).bind(2, p->attempt).bind(3, p->layout).bind(4, std::string(planner::to_string(p->sync)));
  s.bind(5, p->inner_steps);
  s.bind(6, p->step_s).bind(7, p->wan_gbps).bind(8, p->cost).bind(9, p->standby ? 1 : 0);
  s.bind(10, p->share0_stays_out ? 2 : p->rendezvous_moved ? 1 : 0).step();
  Statement share(db_,
                  "INSERT INTO placement_shares(job_id, position, cluster, ranks, layout, absent, started_s) "
                  "VALUES(?, ?, ?, ?, ?, ?, ?)",
                  path_);
  for (size_t i = 0; i < p->shares.size(); ++i) {
    sqlite3_reset(share.raw());
    share.bind(1, job_id).bind(2, static_cast<int64_t>(i)).bind(3, p->shares[i].cluster);
    share.bind(4, p->shares[i].ranks).bind(5, p->shares[i].layout).bind(6, p->shares[i].absent ? 1 : 0);
    share.bind(7, p->shares[i].started_s).step();
  }
}

std::optional<PlacementRecord> StateStore::read_placement(int64_t job_id) const {
  Statement s(db_,
              "SELECT attempt, layout, sync, inner_steps, step_s, wan_gbps, cost, standby, moved FROM placements "
              "WHERE job_id = ?",
              path_);
  s.bind(1, job_id);
  if (!s.step()) return std::nullopt;
  PlacementRecord p;
  p.attempt = static_cast<int>(s.integer(0));
  p.layout = s.text(1), p.sync = planner::parse_layout_sync(s.text(2));  // the words of describe()
  p.inner_steps = static_cast<int>(s.integer(3));
  p.step_s = s.real(4), p.wan_gbps = s.real(5), p.cost = s.real(6);
  p.standby = s.integer(7) != 0;
  p.rendezvous_moved = s.integer(8) != 0;  // 1: share 0 may come back, 2: it stays out
  p.share0_stays_out = s.integer(8) == 2;
  Statement sh(db_,
               "SELECT cluster, ranks, layout, absent, started_s FROM placement_shares WHERE job_id = ? ORDER BY position",
               path_);
  sh.bind(1, job_id);
  while (sh.step())
    p.shares.push_back({sh.text(0), static_cast<int>(sh.integer(1)), sh.text(2), sh.integer(3) != 0, sh.real(4)});
  return p;
}

void StateStore::add_usage(const std::string& user, const std::string& cluster, double device_s) {
  if (device_s <= 0) return;
  Statement s(db_,
              "INSERT INTO usage(user, cluster, device_s) VALUES(?, ?, ?) "
              "ON CONFLICT(user, cluster) DO UPDATE SET device_s = device_s + excluded.device_s",
              path_);
  s.bind(1, user).bind(2, cluster).bind(3, device_s).step();
}

std::vector<StateStore::UsageRow> StateStore::usage() const {
  std::vector<UsageRow> rows;
  Statement s(db_, "SELECT user, cluster, device_s FROM usage ORDER BY user, cluster", path_);
  while (s.step()) rows.push_back({s.text(0), s.text(1), s.real(2)});
  return rows;
}

void StateStore::add_event(double time_s, int64_t job_id, const std::string& kind, const std::string& detail) {
  Statement s(db_, "INSERT INTO events(time_s, job_id, kind, detail) VALUES(?, ?, ?, ?)", path_);
  s.bind(1, time_s).bind(2, job_id).bind(3, kind).bind(4, detail).step();
}

JobRecord StateStore::read_job_row(void* raw) const {
  auto* s = static_cast<sqlite3_stmt*>(raw);
  auto text = [&](int c) {
    const unsigned char* t = sqlite3_column_text(s, c);
    return std::string(t ? reinterpret_cast<const char*>(t) : "");
  };
  JobRecord j;
  j.id = sqlite3_column_int64(s, 0);
  j.spec = job_spec_from_json(text(1));
  j.state = parse_job_state(text(2));
  j.attempts = sqlite3_column_int(s, 3);
  j.step = sqlite3_column_int64(s, 4);
  j.reason = text(5);
  j.submitted_s = sqlite3_column_double(s, 6);
  j.updated_s = sqlite3_column_double(s, 7);
  j.placement = read_placement(j.id);
  // Restarts are the job's "restarted" events (the events table is the record of what happened to a job).
  Statement restarts(db_, "SELECT COUNT(*) FROM events WHERE job_id = ? AND kind = 'restarted'", path_);
  restarts.bind(1, j.id);
  if (restarts.step()) j.restarts = static_cast<int>(restarts.integer(0));
  return j;
}

std::vector<JobRecord> StateStore::jobs() const {
  std::vector<JobRecord> out;
  Statement s(db_, "SELECT id, spec, state, attempts, step, reason, submitted_s, updated_s FROM jobs ORDER BY id", path_);
  while (s.step()) out.push_back(read_job_row(s.raw()));
  return out;
}

std::optional<JobRecord> StateStore::job(int64_t id) const {
  Statement s(db_, "SELECT id, spec, state, attempts, step, reason, submitted_s, updated_s FROM jobs WHERE id = ?", path_);
  s.bind(1, id);
  if (!s.step()) return std::nullopt;
  return read_job_row(s.raw());
}

std::vector<EventRow> StateStore::events(int64_t job_id) const {
  std::vector<EventRow> out;
  Statement s(db_,
              job_id < 0 ? "SELECT id, time_s, job_id, kind, detail FROM events WHERE ? < 0 ORDER BY id"
                         : "SELECT id, time_s, job_id, kind, detail FROM events WHERE job_id = ? ORDER BY id",
              path_);
  s.bind(1, job_id);
  while (s.step()) out.push_back({s.integer(0), s.real(1), s.integer(2), s.text(3), s.text(4)});
  return out;
}

int64_t StateStore::last_job_id() const {
  Statement s(db_, "SELECT coalesce(max(id), 0) FROM jobs", path_);
  return s.step() ? s.integer(0) : 0;
}

}  // namespace crosstrain::scheduler
