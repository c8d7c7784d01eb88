#include "crosstrain/scheduler/slurm_executor.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "crosstrain/core/error.h"
#include "crosstrain/scheduler/command.h"
#include "crosstrain/scheduler/train_share.h"

namespace crosstrain::scheduler {
namespace fs = std::filesystem;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  std::string text = s.str();
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

void write_file(const fs::path& p, const std::string& text) {
  const fs::path tmp = p.string() + ".tmp";
  std::ofstream(tmp) << text;
  fs::rename(tmp, p);
}

std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

// `key=` in scontrol's one-line output: the value up to the next space, or "" when absent.
std::string field(const std::string& text, const std::string& key) {
  size_t at = 0;
  while ((at = text.find(key + "=", at)) != std::string::npos) {
    if (at == 0 || text[at - 1] == ' ' || text[at - 1] == '\n') {
      const size_t begin = at + key.size() + 1;
      return text.substr(begin, text.find_first_of(" \n", begin) - begin);
    }
    at += key.size();
  }
  return "";
}

}  // namespace

std::string node_at_address(const std::string& scontrol_nodes, const std::string& addr) {
  std::istringstream lines(scontrol_nodes);
  for (std::string line; std::getline(lines, line);)
    if (field(line, "NodeAddr") == addr) return field(line, "NodeName");
  return "";
}

std::vector<std::string> share_resources(const SlurmCluster& c, int ranks) {
  const std::vector<int> nodes = share_node_sizes(ranks, c.devices_per_node);
  std::vector<std::string> args{"--nodes=" + std::to_string(nodes.size())};
  // One launcher a node over several (srun starts them); on one node the launcher starts every rank.
  args.push_back(nodes.size() == 1 ? "--ntasks=" + std::to_string(ranks) : "--ntasks-per-node=1");
  // A CPU cluster's devices are its CPUs; a GPU cluster's are each node's generic resources (gres).
  if (c.gpus)
    args.push_back("--gres=gpu:" + std::to_string(nodes.front()));
  else if (nodes.size() > 1)
    args.push_back("--cpus-per-task=" + std::to_string(c.devices_per_node));
  return args;
}

bool SlurmJobState::ended() const {
  static const std::set<std::string> kTerminal{"BOOT_FAIL", "CANCELLED", "COMPLETED",     "DEADLINE", "FAILED",
                                               "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY", "TIMEOUT"};
  return state.empty() || kTerminal.count(state) > 0;
}

std::string SlurmJobState::failure() const {
  if (state.empty()) return "ended without an exit status (Slurm no longer knows it: cancelled or lost)";
  if (state == "COMPLETED" && exit_code == 0) return "";
  if (exit_code != 0) return "exited with " + std::to_string(exit_code) + " (Slurm: " + state + ")";
  if (signal != 0) return "was ended by signal " + std::to_string(signal) + " (Slurm: " + state + ")";
  return "ended " + state + " without an exit status";
}

std::optional<SlurmJobState> parse_sacct_job(const std::string& text) {
  // "COMPLETED|0:0" (sacct -X -n -P -o State,ExitCode); "CANCELLED by 0|0:15" names who cancelled it.
  const std::string line = first_line(text);
  const size_t bar = line.find('|');
  if (bar == std::string::npos) return std::nullopt;
  return parse_scontrol_job("JobState=" + line.substr(0, line.find_first_of(" |")) + " ExitCode=" + line.substr(bar + 1));
}

std::optional<SlurmJobState> parse_scontrol_job(const std::string& text) {
  SlurmJobState s;
  s.state = field(text, "JobState");
  if (s.state.empty() || s.state.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZ_") != std::string::npos)
    return std::nullopt;
  const std::string code = field(text, "ExitCode");  // "status:signal"
  const size_t colon = code.find(':');
  try {
    if (colon != std::string::npos) {
      s.exit_code = std::stoi(code.substr(0, colon));
      s.signal = std::stoi(code.substr(colon + 1));
    }
  } catch (const std::exception&) {
    return std::nullopt;
  }
  return s;
}

SlurmExecutor::SlurmExecutor(std::vector<SlurmCluster> clusters, std::string work_dir, ShareCommand command,
                             std::chrono::milliseconds command_timeout)
    : clusters_(std::move(clusters)), work_dir_(std::move(work_dir)), command_(std::move(command)),
      timeout_(command_timeout) {
  fs::create_directories(work_dir_);
  reaper_ = std::thread([this] { reap_loop(); });
}

SlurmExecutor::~SlurmExecutor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closing_ = true;
  }
  wake_.notify_all();
  reaper_.join();
}

bool SlurmExecutor::reachable(const std::string& cluster) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return unreachable_.count(cluster) == 0;
}

size_t SlurmExecutor::stopping() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stopping_.size();
}

const SlurmCluster& SlurmExecutor::cluster(const std::string& name) const {
  for (const auto& c : clusters_)
    if (c.name == name) return c;
  throw UsageError("scheduler: no Slurm cluster named '" + name + "' is configured for the executor");
}

int SlurmExecutor::share_nodes(const std::string& name, int ranks) const {
  return static_cast<int>(share_node_sizes(ranks, cluster(name).devices_per_node).size());
}

std::string SlurmExecutor::job_dir(int64_t job_id) const { return job_dir_in(work_dir_, job_id); }

std::string SlurmExecutor::run_dir(int64_t job_id) const { return job_run_dir(work_dir_, job_id); }

// One share as a batch job: its script is kept in the job's folder here (sbatch hands it to the controller), its
// output at the cluster's own folder; how it ended comes from Slurm (status()).
std::string SlurmExecutor::submit(const JobRecord& job, const PlacementRecord& placement, size_t share) {
  const ClusterShare& s = placement.shares[share];
  const SlurmCluster& c = cluster(s.cluster);
  const std::string stem = (fs::path(job_dir(job.id)) / ("share" + std::to_string(share))).string();
  // sbatch reads the script here and hands it to the controller: the nodes never read the scheduler's folder.
  write_file(stem + ".sh", share_script(job, placement, share, command_(job, placement, share), ""));
  // The launcher in the script starts the share's ranks on its node; over several nodes, one launcher a node.
  const std::vector<int> nodes = share_node_sizes(s.ranks, c.devices_per_node);
  const std::string output = c.site_dir.empty() ? stem + ".out"
                                                : (fs::path(c.site_dir) / ("job" + std::to_string(job.id) + "-share" +
                                                                           std::to_string(share) + "-%j.out")).string();
  // --no-requeue: a share Slurm would run again after a node failure or preemption is one the scheduler counts as
  // ended (and starts again itself, into the running job or a new placement).
  std::vector<std::string> argv{"sbatch", "--parsable", "--job-name=ct" + std::to_string(job.id) + "-" + s.cluster,
                                "--output=" + output, "--export=ALL", "--no-requeue"};
  for (std::string& a : share_resources(c, s.ranks)) argv.push_back(std::move(a));
  if (!c.partition.empty()) argv.push_back("--partition=" + c.partition);
  // The job's rendezvous is on share 0's node 0 at the cluster's address whenever the job spans several nodes, and
  // its standby store (PlacementRecord::standby) on share 1's node 0 at that cluster's.
  const bool holds_store = (share == 0 && !placement.rendezvous_moved) || (share == 1 && placement.standby);
  if (holds_store && (nodes.size() > 1 || placement.shares.size() > 1) && !c.rendezvous_addr.empty())
    argv.push_back("--nodelist=" + rendezvous_node(c, job.id, share));
  argv.push_back(stem + ".sh");
  // The job's secret rides in sbatch's environment (--export=ALL), which Slurm gives the batch script.
  const CommandResult r =
      run_command(argv, {{"SLURM_CONF", c.conf}, {"CROSSTRAIN_SECRET", job_secret(work_dir_, job.id)}}, timeout_);
  if (!r.ok())
    throw Error("scheduler: job " + std::to_string(job.id) + ": sbatch on cluster '" + s.cluster + "' failed" +
                (r.timed_out ? " (no answer within the timeout)" : "") + ": " + first_line(r.output));
  const std::string id = first_line(r.output).substr(0, first_line(r.output).find(';'));  // "id" or "id;cluster"
  write_file(stem + ".slurm", s.cluster + " " + id);
  return id;
}

std::string SlurmExecutor::rendezvous_node(const SlurmCluster& c, int64_t job_id, size_t share) const {
  const CommandResult r = run_command({"scontrol", "show", "node", "-o"}, {{"SLURM_CONF", c.conf}}, timeout_);
  const std::string name = r.ok() ? node_at_address(r.output, c.rendezvous_addr) : "";
  if (name.empty() || name.find_first_of(" ,;'\"$`\\") != std::string::npos)
    throw Error("scheduler: job " + std::to_string(job_id) + ": no node of cluster '" + c.name + "' is at " +
                c.rendezvous_addr + " (--cluster-host), where its share " + std::to_string(share) + " would host the job's " +
                (share == 0 ? "rendezvous" : "standby store") + (r.ok() ? "" : ": scontrol show node failed: " + first_line(r.output)));
  return name;
}

void SlurmExecutor::start(const JobRecord& job, const PlacementRecord& placement) {
  const fs::path dir = job_dir(job.id);
  // A re-placed job starts its shares afresh; its run folder (checkpoints) stays.
  std::error_code ec;
  if (fs::is_directory(dir))
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().rfind("share", 0) == 0) fs::remove_all(e.path(), ec);
  fs::create_directories(dir);
  for (size_t i = 0; i < placement.shares.size(); ++i) {
    try {
      submit(job, placement, i);
    } catch (...) {
      stop(job.id);  // all or nothing: the shares already submitted go
      throw;
    }
  }
}

void SlurmExecutor::store_moved(const JobRecord& job, const PlacementRecord& placement) {
  outputs_follow_store(work_dir_, job.id, placement);
}

bool SlurmExecutor::has_sites(int64_t job_id) const { return job_has_sites(work_dir_, job_id); }

bool SlurmExecutor::own_address(const std::string& name) const { return !cluster(name).rendezvous_addr.empty(); }

void SlurmExecutor::start_share(const JobRecord& job, const PlacementRecord& placement, size_t share) {
  if (share >= placement.shares.size()) throw UsageError("share " + std::to_string(share) + " is not in the placement");
  submit(job, placement, share);
}

void SlurmExecutor::stop_share(int64_t job_id, size_t share) {
  const std::string stem = (fs::path(job_dir(job_id)) / ("share" + std::to_string(share))).string();
  if (!fs::exists(stem + ".slurm")) return;
  std::istringstream in(read_file(stem + ".slurm"));
  std::string name, id;
  if (in >> name >> id && reachable(name))
    run_command({"scancel", "--full", id}, {{"SLURM_CONF", cluster(name).conf}}, timeout_);
  std::error_code ec;
  fs::rename(stem + ".slurm", stem + ".slurm.gone", ec);
  fs::rename(stem + ".out", stem + ".out.gone", ec);
  fs::remove(stem + ".exit", ec);
}

std::map<std::string, std::string> SlurmExecutor::slurm_ids(int64_t job_id) const {
  std::map<std::string, std::string> ids;
  const fs::path dir = job_dir(job_id);
  if (!fs::exists(dir)) return ids;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".slurm") continue;
    std::istringstream in(read_file(e.path()));
    std::string cluster, id;
    if (in >> cluster >> id) ids[cluster] = id;
  }
  return ids;
}

void SlurmExecutor::stop(int64_t job_id) {
  const auto now = std::chrono::steady_clock::now();
  for (const auto& [name, id] : slurm_ids(job_id)) {
    // A lost cluster cannot be asked; its job ends with it.
    if (!reachable(name)) continue;
    run_command({"scancel", id}, {{"SLURM_CONF", cluster(name).conf}}, timeout_);
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_.push_back({cluster(name).conf, id, now, false});
  }
  wake_.notify_all();
}

bool SlurmExecutor::reap_once(Stopping& s) const {
  const CommandResult r = run_command({"squeue", "-h", "-j", s.id, "-o", "%T"}, {{"SLURM_CONF", s.conf}}, timeout_);
  if (!r.ok() || first_line(r.output).empty()) return true;  // gone (or its cluster no longer answers)
  const auto waited = std::chrono::steady_clock::now() - s.since;
  if (waited > stop_grace_) return true;
  if (!s.killed && waited > stop_grace_ / 2) {
    run_command({"scancel", "--signal=KILL", "--full", s.id}, {{"SLURM_CONF", s.conf}}, timeout_);
    s.killed = true;
  }
  return false;
}

void SlurmExecutor::reap_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!closing_) {
    if (stopping_.empty()) {
      wake_.wait(lock, [this] { return closing_ || !stopping_.empty(); });
      continue;
    }
    std::vector<Stopping> watch = stopping_;
    lock.unlock();
    std::vector<std::string> gone;
    for (Stopping& s : watch)
      if (reap_once(s)) gone.push_back(s.id + "@" + s.conf);
    lock.lock();
    // Entries added meanwhile stay; the watched ones take their new state.
    for (Stopping& s : stopping_)
      for (const Stopping& w : watch)
        if (w.id == s.id && w.conf == s.conf) s.killed = w.killed;
    stopping_.erase(std::remove_if(stopping_.begin(), stopping_.end(),
                                   [&](const Stopping& s) {
                                     return std::find(gone.begin(), gone.end(), s.id + "@" + s.conf) != gone.end();
                                   }),
                    stopping_.end());
    wake_.wait_for(lock, std::chrono::milliseconds(200), [this] { return closing_; });
  }
}

std::optional<SlurmJobState> SlurmExecutor::slurm_job(const SlurmCluster& c, const std::string& id) {
  // A controller that did not answer its last ping is not asked again: its commands retry a dead one for 18 s.
  if (!reachable(c.name)) return std::nullopt;
  const CommandResult r = run_command({"scontrol", "show", "job", "-o", id}, {{"SLURM_CONF", c.conf}}, timeout_);
  if (r.ok()) return parse_scontrol_job(r.output);
  // A job id the controller has already purged (MinJobAge after its end: the daemon was down that long): that one
  // ended, unlike an unreachable cluster. Slurm's accounting still knows how, where the cluster keeps one.
  if (r.output.find("Invalid job id") == std::string::npos) return std::nullopt;
  const CommandResult acct = run_command({"sacct", "-j", id, "-X", "-n", "-P", "-o", "State,ExitCode"},
                                         {{"SLURM_CONF", c.conf}}, timeout_);
  if (acct.ok())
    if (auto ended = parse_sacct_job(acct.output)) return ended;
  return SlurmJobState{};
}

std::string SlurmExecutor::share_stem(int64_t job_id, const std::string& cluster, const std::string& id) const {
  for (const auto& e : fs::directory_iterator(job_dir(job_id)))
    if (e.path().extension() == ".slurm" && read_file(e.path()) == cluster + " " + id)
      return fs::path(e.path()).replace_extension("").string();
  return "";
}

ExecStatus SlurmExecutor::status(int64_t job_id) {
  ExecStatus st;
  st.checkpoint_step = newest_checkpoint_step(run_dir(job_id));  // known even when a share failed or is lost
  st.step = last_metrics_step(run_dir(job_id));
  const auto ids = slurm_ids(job_id);
  if (ids.empty()) {
    st.detail = "no shares submitted";
    return st;
  }
  int done = 0;
  for (const auto& [name, id] : ids) {
    const std::string stem = share_stem(job_id, name, id);
    st.failed_share = share_number(fs::path(stem).filename().string());  // meaningful only with kind Failed
    std::string ended = !stem.empty() && fs::exists(stem + ".exit") ? read_file(stem + ".exit") : "";
    if (ended.empty()) {
      const std::optional<SlurmJobState> job = slurm_job(cluster(name), id);
      if (!job) {
        // The cluster does not answer: lost_clusters() decides whether it is gone; until then nothing is known.
        st.kind = ExecStatus::Unknown;
        st.detail = "cluster " + name + " does not answer scontrol show job (or answers what cannot be read)";
        return st;
      }
      if (!job->ended()) {
        st.detail += name + ": " + job->state + " ";
        continue;
      }
      // Kept here: Slurm forgets an ended job after MinJobAge, and a daemon started again still knows.
      ended = job->failure().empty() ? "0" : job->failure();
      if (!stem.empty()) write_file(stem + ".exit", ended);
    }
    if (ended != "0") {
      st.kind = ExecStatus::Failed;
      // A number: written by an earlier version's batch script.
      const bool number = ended.find_first_not_of("0123456789") == std::string::npos;
      st.detail = "share on " + name + " (Slurm job " + id + ") " + (number ? "exited with " + ended : ended);
      return st;
    }
    ++done;
  }
  st.kind = done == static_cast<int>(ids.size()) ? ExecStatus::Done : ExecStatus::Running;
  st.failed_share = -1;
  return st;
}

std::vector<std::string> SlurmExecutor::lost_clusters() {
  std::vector<std::string> lost;
  for (const auto& c : clusters_) {
    const CommandResult r = run_command({"scontrol", "ping"}, {{"SLURM_CONF", c.conf}}, timeout_);
    if (!r.ok() || r.output.find("UP") == std::string::npos) lost.push_back(c.name);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  unreachable_ = {lost.begin(), lost.end()};
  return lost;
}

}  // namespace crosstrain::scheduler
