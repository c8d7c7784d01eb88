#include "crosstrain/scheduler/local_executor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <thread>

#include "crosstrain/core/error.h"
#include "crosstrain/scheduler/train_share.h"

namespace crosstrain::scheduler {
namespace fs = std::filesystem;

namespace {

std::string trimmed(const fs::path& p) {
  std::ifstream in(p);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// Every share's process group of a job, from its shareK.pid files.
std::vector<std::pair<fs::path, pid_t>> share_groups(const fs::path& dir) {
  std::vector<std::pair<fs::path, pid_t>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".pid") {
      try {
        out.emplace_back(e.path(), static_cast<pid_t>(std::stol(trimmed(e.path()))));
      } catch (const std::exception&) {
        // a pid file cut short by a crash: that share never started
      }
    }
  return out;
}

// Whether any process of the group is left (reaping our own children so that they do not linger as zombies).
bool group_alive(pid_t pgid) {
  while (::waitpid(-pgid, nullptr, WNOHANG) > 0) {
  }
  return ::kill(-pgid, 0) == 0;
}

}  // namespace

LocalExecutor::LocalExecutor(std::string work_dir, ShareCommand command, std::chrono::milliseconds stop_grace,
                             int max_ranks)
    : work_dir_(std::move(work_dir)), command_(std::move(command)), grace_(stop_grace),
      max_ranks_(max_ranks > 0 ? max_ranks : 2 * static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))) {
  fs::create_directories(work_dir_);
}

std::string LocalExecutor::run_dir(int64_t job_id) const { return job_run_dir(work_dir_, job_id); }

// bash SCRIPT > OUT 2>&1 in a process group of its own (out of reach of the daemon's terminal's Ctrl-C).
int LocalExecutor::spawn(const std::string& script, const std::string& out, const std::string& secret) const {
  // The environment is built before fork: the daemon has threads, and a child may only exec then.
  std::vector<std::string> vars{"CROSSTRAIN_SECRET=" + secret};
  for (char** e = environ; *e; ++e)
    if (std::string(*e).rfind("CROSSTRAIN_SECRET=", 0) != 0) vars.emplace_back(*e);
  std::vector<char*> envp;
  for (std::string& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw Error("scheduler: cannot fork to start " + script);
  if (pid == 0) {
    ::setpgid(0, 0);
    const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int null = ::open("/dev/null", O_RDONLY);
    if (fd >= 0) ::dup2(fd, 1), ::dup2(fd, 2);
    if (null >= 0) ::dup2(null, 0);
    // Nothing of the daemon's (its listening socket, the state file) may outlive it in the job's processes.
    ::close_range(3, ~0U, 0);
    char* argv[] = {const_cast<char*>("bash"), const_cast<char*>(script.c_str()), nullptr};
    ::execve("/bin/bash", argv, envp.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // also here: the group exists before anyone looks for it, whichever runs first
  return pid;
}

void LocalExecutor::start(const JobRecord& job, const PlacementRecord& placement) {
  if (placement.ranks() > max_ranks_)
    throw UsageError("job " + std::to_string(job.id) + " places " + std::to_string(placement.ranks()) +
                     " ranks on this machine, which runs at most " + std::to_string(max_ranks_) +
                     " (two per core; crosstrain scheduler --max-local-ranks N allows more)");
  const fs::path dir = job_dir_in(work_dir_, job.id);
  std::error_code ec;
  if (fs::is_directory(dir))
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().filename().string().rfind("share", 0) == 0) fs::remove_all(e.path(), ec);
  fs::create_directories(dir);
  // Build every share's command first: a share that cannot be built starts nothing (all or nothing).
  std::vector<std::string> stems;
  for (size_t i = 0; i < placement.shares.size(); ++i) {
    const std::string stem = (dir / ("share" + std::to_string(i))).string();
    std::ofstream(stem + ".sh") << share_script(job, placement, i, command_(job, placement, i), stem);
    stems.push_back(stem);
  }
  for (const std::string& stem : stems) spawn_share(stem, job.id);
}

// Starts the script STEM.sh (output STEM.out) and records its process group in STEM.pid.
void LocalExecutor::spawn_share(const std::string& stem, int64_t job_id) const {
  const int pid = spawn(stem + ".sh", stem + ".out", job_secret(work_dir_, job_id));
  std::ofstream(stem + ".pid.tmp") << pid << "\n";
  fs::rename(stem + ".pid.tmp", stem + ".pid");
}

void LocalExecutor::launch_share(const JobRecord& job, const PlacementRecord& placement, size_t share) {
  const std::string stem = (fs::path(job_dir_in(work_dir_, job.id)) / ("share" + std::to_string(share))).string();
  std::ofstream(stem + ".sh") << share_script(job, placement, share, command_(job, placement, share), stem);
  spawn_share(stem, job.id);
}

void LocalExecutor::store_moved(const JobRecord& job, const PlacementRecord& placement) {
  outputs_follow_store(work_dir_, job.id, placement);
}

bool LocalExecutor::has_sites(int64_t job_id) const { return job_has_sites(work_dir_, job_id); }

void LocalExecutor::start_share(const JobRecord& job, const PlacementRecord& placement, size_t share) {
  if (share >= placement.shares.size()) throw UsageError("share " + std::to_string(share) + " is not in the placement");
  if (placement.present_ranks() > max_ranks_)
    throw UsageError("job " + std::to_string(job.id) + " would run " + std::to_string(placement.present_ranks()) +
                     " ranks on this machine, which runs at most " + std::to_string(max_ranks_));
  launch_share(job, placement, share);
}

void LocalExecutor::end_group(pid_t pgid) const {
  ::kill(-pgid, SIGTERM);
  const auto until = std::chrono::steady_clock::now() + grace_;
  while (group_alive(pgid) && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  if (group_alive(pgid)) ::kill(-pgid, SIGKILL);
}

void LocalExecutor::stop_share(int64_t job_id, size_t share) {
  const fs::path stem = fs::path(job_dir_in(work_dir_, job_id)) / ("share" + std::to_string(share));
  const fs::path pid_file = stem.string() + ".pid";
  if (!fs::exists(pid_file)) return;
  try {
    end_group(static_cast<pid_t>(std::stol(trimmed(pid_file))));
  } catch (const std::exception&) {
    // a pid file cut short by a crash: that share never started
  }
  // Kept for whoever looks into why it went; status() reads *.pid and *.exit only.
  std::error_code ec;
  fs::rename(pid_file, stem.string() + ".pid.gone", ec);
  fs::rename(stem.string() + ".out", stem.string() + ".out.gone", ec);
  fs::remove(stem.string() + ".exit", ec);
}

void LocalExecutor::stop(int64_t job_id) {
  const auto groups = share_groups(job_dir_in(work_dir_, job_id));
  for (const auto& [path, pgid] : groups) ::kill(-pgid, SIGTERM);
  const auto until = std::chrono::steady_clock::now() + grace_;
  for (const auto& [path, pgid] : groups) {
    while (group_alive(pgid) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (group_alive(pgid)) ::kill(-pgid, SIGKILL);
  }
}

ExecStatus LocalExecutor::status(int64_t job_id) {
  ExecStatus st;
  st.checkpoint_step = newest_checkpoint_step(run_dir(job_id));
  st.step = last_metrics_step(run_dir(job_id));
  const auto groups = share_groups(job_dir_in(work_dir_, job_id));
  if (groups.empty()) {
    st.detail = "no shares started";
    return st;
  }
  size_t done = 0;
  for (const auto& [pid_file, pgid] : groups) {
    const fs::path exit_file = fs::path(pid_file).replace_extension(".exit");
    const std::string share = pid_file.stem().string();
    if (fs::exists(exit_file)) {
      const std::string code = trimmed(exit_file);
      if (code != "0") {
        st.kind = ExecStatus::Failed;
        st.failed_share = share_number(share);
        st.detail = share + " (process group " + std::to_string(pgid) + ") exited with " + code + "; see " +
                    fs::path(pid_file).replace_extension(".out").string();
        return st;
      }
      ++done;
    } else if (!group_alive(pgid)) {
      st.kind = ExecStatus::Failed;
      st.failed_share = share_number(share);
      st.detail = share + " (process group " + std::to_string(pgid) + ") ended without an exit status (killed)";
      return st;
    }
  }
  st.kind = done == groups.size() ? ExecStatus::Done : ExecStatus::Running;
  return st;
}

}  // namespace crosstrain::scheduler
