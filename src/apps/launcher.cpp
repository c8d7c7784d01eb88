#include "launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <numeric>
#include <sstream>
#include <thread>

#include "crosstrain/comm/rendezvous.h"
#include "crosstrain/store/auth.h"
#include "crosstrain/core/error.h"
#include "crosstrain/core/launch_env.h"
#include "line_folder.h"

namespace crosstrain::apps {
namespace {

using Clock = std::chrono::steady_clock;

// Ranks of one job, at most: far above any machine here, low enough that rank arithmetic never overflows an int.
constexpr int kMaxWorld = 1 << 20;

// Signal handlers only write the signal number here; the main loop reads it.
int g_signal_pipe[2] = {-1, -1};

void on_signal(int sig) {
  unsigned char s = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &s, 1);
}

// The signal on_signal() recorded, if any (0: none), taken from the pipe.
int pending_signal() {
  unsigned char sig = 0;
  return read(g_signal_pipe[0], &sig, 1) == 1 ? sig : 0;
}

struct Stream {
  int fd = -1;
  std::string pending;  // bytes after the last newline
};

struct Rank {
  int rank = 0;
  int local = 0;
  int restarts = 0;
  pid_t pid = -1;
  bool running = false;
  int status = 0;
  Stream out, err;
};

void print_lines(const std::vector<std::string>& lines) {
  for (const auto& line : lines) std::cerr << line + "\n" << std::flush;
}

// A line of a rank: stderr lines with their rank go through `folder` (what several ranks print alike is printed
// once), the rest as they come.
void emit(int rank, const std::string& line, bool is_err, bool prefix, LineFolder& folder) {
  if (is_err && prefix) return print_lines(folder.offer(rank, line, Clock::now()));
  std::string text = (prefix ? "[rank " + std::to_string(rank) + "] " : std::string()) + line + "\n";
  (is_err ? std::cerr : std::cout) << text << std::flush;
}

// Reads what is available; returns false at end of file.
bool pump(Rank& r, Stream& s, bool is_err, bool prefix, LineFolder& folder) {
  char buf[8192];
  ssize_t n = read(s.fd, buf, sizeof buf);
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
  if (n <= 0) {
    if (!s.pending.empty()) emit(r.rank, s.pending, is_err, prefix, folder);
    s.pending.clear();
    close(s.fd);
    s.fd = -1;
    return false;
  }
  if (!prefix) {
    // Unprefixed (rank 0's report): pass bytes through as they come, so a progress bar redrawn with '\r'
    // stays live.
    (is_err ? std::cerr : std::cout).write(buf, n).flush();
    return true;
  }
  s.pending.append(buf, static_cast<size_t>(n));
  size_t start = 0;
  for (size_t nl; (nl = s.pending.find('\n', start)) != std::string::npos; start = nl + 1)
    emit(r.rank, s.pending.substr(start, nl - start), is_err, prefix, folder);
  s.pending.erase(0, start);
  return true;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    const char* name = strsignal(sig);
    return "signal " + std::to_string(sig) + (name ? std::string(" (") + name + ")" : "");
  }
  return "status " + std::to_string(status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

bool failed(int status) { return !(WIFEXITED(status) && WEXITSTATUS(status) == 0); }

pid_t spawn(const std::vector<std::string>& command, const std::map<std::string, std::string>& env, int out_fd,
            int err_fd, int nice) {
  std::vector<char*> argv;
  for (const auto& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t launcher = getpid();
  pid_t pid = fork();
  if (pid != 0) return pid;
  // Child: ends with the launcher, however the launcher ends (SIGKILL too: nothing can catch that one). The
  // check after prctl covers a launcher that died before it.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  // Ranks run at the priority the launcher was started with, whatever the launcher gave itself (elastic below).
  setpriority(PRIO_PROCESS, 0, nice);
  if (getppid() != launcher) _exit(1);
  // Its own process group, so that stopping a rank also stops what it started.
  setpgid(0, 0);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  signal(SIGPIPE, SIG_DFL);
  dup2(out_fd, STDOUT_FILENO);
  dup2(err_fd, STDERR_FILENO);
  for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  execvp(argv[0], argv.data());
  std::string msg = "crosstrain run: cannot start '" + command[0] + "': " + strerror(errno) + "\n";
  [[maybe_unused]] ssize_t n = write(STDERR_FILENO, msg.data(), msg.size());
  _exit(127);
}

// Reaps rank `pid` once it has exited, ending first what it left running in its process group (a background
// child, a shell's half-started pipeline): nothing else would, since only running ranks are signalled. The
// group is killed while the exited rank is still a zombie, so its id cannot have been given to another process.
bool reap_with_group(pid_t pid, int& status) {
  siginfo_t info{};
  if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid != pid)
    return false;
  kill(-pid, SIGKILL);
  return waitpid(pid, &status, 0) == pid;
}

void signal_all(std::vector<Rank>& ranks, int sig) {
  for (auto& r : ranks) {
    if (!r.running) continue;
    if (kill(-r.pid, sig) != 0) kill(r.pid, sig);
    // A stopped rank (SIGSTOP, a debugger) acts on SIGTERM or SIGINT only once it runs again.
    if (sig != SIGKILL && kill(-r.pid, SIGCONT) != 0) kill(r.pid, SIGCONT);
  }
}

// Ends the ranks started so far (a later one could not be started) and reaps them: none is left behind.
void stop_started(std::vector<Rank>& ranks) {
  for (auto& r : ranks) {
    if (r.pid <= 0) continue;
    if (kill(-r.pid, SIGKILL) != 0) kill(r.pid, SIGKILL);
    waitpid(r.pid, nullptr, 0);
    r.running = false;
    if (r.out.fd >= 0) close(r.out.fd);
    if (r.err.fd >= 0) close(r.err.fd);
    r.out.fd = r.err.fd = -1;
  }
}

// Starts rank `r` with its torchrun variables; throws (with errno's text) when a pipe or the fork fails.
void start_rank(Rank& r, int local, int world, int port, const LaunchOptions& o) {
  int out[2], err[2];
  if (pipe(out) != 0) throw Error(std::string("pipe: ") + strerror(errno));
  if (pipe(err) != 0) {
    const int saved = errno;
    close(out[0]);
    close(out[1]);
    throw Error(std::string("pipe: ") + strerror(saved));
  }
  std::map<std::string, std::string> env = o.extra_env;
  // The secret travels in the environment only: a command line is readable by every user of the machine.
  if (!o.secret.empty()) env["CROSSTRAIN_SECRET"] = o.secret;
  if (!o.job_id.empty()) env["CROSSTRAIN_JOB_ID"] = o.job_id;
  env["RANK"] = std::to_string(r.rank);
  if (o.elastic.enabled) {
    env["CROSSTRAIN_ELASTIC"] = "1";
    env["CROSSTRAIN_RESTART_COUNT"] = std::to_string(r.restarts);
  }
  env["WORLD_SIZE"] = std::to_string(world);
  env["LOCAL_RANK"] = std::to_string(local);
  env["LOCAL_WORLD_SIZE"] = std::to_string(o.nproc);
  env["GROUP_RANK"] = std::to_string(o.node_rank);
  env["MASTER_ADDR"] = o.master_addr;
  env["MASTER_PORT"] = std::to_string(port);
  if (o.standby_port > 0) env["CROSSTRAIN_STANDBY"] = o.standby_addr + ":" + std::to_string(o.standby_port);
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  if (!getenv("OMP_NUM_THREADS")) env["OMP_NUM_THREADS"] = "1";
  r.pid = spawn(o.command, env, out[1], err[1], o.rank_nice);
  const int fork_errno = errno;
  close(out[1]);
  close(err[1]);
  if (r.pid < 0) {
    close(out[0]);
    close(err[0]);
    throw Error(std::string("fork: ") + strerror(fork_errno));
  }
  setpgid(r.pid, r.pid);  // also here, so a signal sent right away finds the group
  r.out.fd = out[0];
  r.err.fd = err[0];
  fcntl(r.out.fd, F_SETFL, O_NONBLOCK);
  fcntl(r.err.fd, F_SETFL, O_NONBLOCK);
  r.running = true;
}

// Passes the ranks' output on, forwards signals, and stops every rank when one fails; returns once all have
// exited (and their pipes are drained), with the launcher's exit code.
// Elastic: the rank's old output is passed on to the end, then a new process takes its place.
void restart_rank(Rank& r, int world, int port, const LaunchOptions& o, LineFolder& folder) {
  for (Stream* s : {&r.out, &r.err})
    while (s->fd >= 0 && pump(r, *s, s == &r.err, o.prefix_output && (s == &r.err || r.rank != 0 || o.prefix_rank0_stdout),
                              folder)) {
      pollfd p{s->fd, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) {  // a child of the rank still holds the pipe: stop listening to it
        close(s->fd);
        s->fd = -1;
      }
    }
  ++r.restarts;
  start_rank(r, r.local, world, port, o);
}

// A rank restarted after the standby took over (--standby) finds the job there: node 0's store is gone.
void restart_rank(Rank& r, int world, int port, const LaunchOptions& o, LineFolder& folder, ElasticSupervisor& elastic) {
  const auto store = elastic.store_for_restarts();
  if (!store) return restart_rank(r, world, port, o, folder);
  LaunchOptions moved = o;
  moved.master_addr = store->first;
  restart_rank(r, world, store->second, moved, folder);
}

// Linux keeps a priority per thread: every thread of the launcher (the store's acceptor, whose connection threads
// inherit it, and the coordinator) gets `nice`. Quietly nothing without the privilege to raise it.
void raise_priority(int nice) {
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task", ec))
    setpriority(PRIO_PROCESS, static_cast<id_t>(std::stoi(task.path().filename().string())), nice);
}

// Elastic: ends the ranks the coordinator excluded alive; they are then restarted like any failed rank.
void end_excluded(std::vector<Rank>& ranks, ElasticSupervisor* elastic) {
  if (!elastic) return;
  // Only the excluded process itself: the rank may run as a new process already.
  for (const auto& [rank, pid] : elastic->take_exclusions())
    for (auto& r : ranks)
      if (r.rank == rank && r.pid == pid && r.running) {
        print_lines({"crosstrain run: ending rank " + std::to_string(rank) + " (pid " + std::to_string(pid) +
                     "): the job went on without its replica"});
        if (kill(-r.pid, SIGKILL) != 0) kill(r.pid, SIGKILL);
      }
}

int supervise(std::vector<Rank>& ranks, const LaunchOptions& o, ElasticSupervisor* elastic, int world, int port) {
  int result = 0;
  int succeeded = 0;
  bool stopping = false;
  bool killed = false;
  bool interrupted = false;  // a SIGINT or SIGTERM was forwarded
  Clock::time_point kill_at{};
  Clock::time_point all_exited_at{};
  bool all_exited = false;
  // Identical lines of crosstrain itself from several ranks wait this long for their copies (line_folder.h).
  LineFolder folder(std::chrono::milliseconds(200), static_cast<int>(ranks.size()));
  for (;;) {
    std::vector<pollfd> fds{{g_signal_pipe[0], POLLIN, 0}};
    std::vector<std::pair<Rank*, bool>> owners{{nullptr, false}};
    for (auto& r : ranks) {
      if (r.out.fd >= 0) { fds.push_back({r.out.fd, POLLIN, 0}); owners.push_back({&r, false}); }
      if (r.err.fd >= 0) { fds.push_back({r.err.fd, POLLIN, 0}); owners.push_back({&r, true}); }
    }
    if (all_exited && (fds.size() == 1 || Clock::now() - all_exited_at > std::chrono::milliseconds(500))) break;
    print_lines(folder.due(Clock::now()));
    // Elastic: a dead rank is noticed here first (its exit), so look more often.
    poll(fds.data(), fds.size(), elastic ? 20 : 100);
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Rank& r = *owners[i].first;
      const bool is_err = owners[i].second;
      pump(r, is_err ? r.err : r.out, is_err, o.prefix_output && (is_err || r.rank != 0 || o.prefix_rank0_stdout),
           folder);
    }
    if (fds[0].revents & POLLIN) {
      unsigned char sig = 0;
      while (read(g_signal_pipe[0], &sig, 1) == 1) {
        if (interrupted && !killed) {
          // A second Ctrl-C: the person does not want to wait for the ranks to finish their step.
          print_lines({std::string("crosstrain run: got ") + strsignal(sig) + " again, killing every rank"});
          signal_all(ranks, SIGKILL);
          killed = true;
          continue;
        }
        print_lines({std::string("crosstrain run: got ") + strsignal(sig) + ", forwarding it to every rank"});
        signal_all(ranks, sig);
        interrupted = true;
        if (!stopping) {
          stopping = true;
          result = 128 + sig;
          // Ranks that handle the signal finish their step (and a checkpoint being written): give them time.
          kill_at = Clock::now() + std::max(o.stop_grace, o.signal_grace);
        }
      }
    }
    for (auto& r : ranks) {
      if (!r.running) continue;
      int status = 0;
      if (!reap_with_group(r.pid, status)) continue;
      r.running = false;
      r.status = status;
      if (!failed(status)) ++succeeded;
      if (failed(status) && !stopping && elastic) {
        // Elastic: the others train on; the rank restarts while the budget lasts.
        if (elastic->on_failure(r.rank, r.pid, describe_status(status))) restart_rank(r, world, port, o, folder, *elastic);
        else if (result == 0) result = exit_code_of(status);
        continue;
      }
      if (failed(status) && !stopping) {
        stopping = true;
        result = exit_code_of(status);
        if (result == 0) result = 1;
        int others = static_cast<int>(std::count_if(ranks.begin(), ranks.end(), [](const Rank& x) { return x.running; }));
        std::string line = "crosstrain run: rank " + std::to_string(r.rank) + " (pid " + std::to_string(r.pid) +
                           ") failed with " + describe_status(status);
        if (others > 0) line += "; stopping the other " + std::to_string(others) + (others == 1 ? " rank" : " ranks");
        print_lines({line});
        signal_all(ranks, o.peer_failure_signal);
        kill_at = Clock::now() + o.stop_grace;
      }
    }
    end_excluded(ranks, elastic);
    if (stopping && !killed && Clock::now() >= kill_at) {
      if (interrupted && std::any_of(ranks.begin(), ranks.end(), [](const Rank& x) { return x.running; }))
        print_lines({"crosstrain run: the ranks did not stop within " +
                     std::to_string(std::chrono::duration_cast<std::chrono::seconds>(
                                        std::max(o.stop_grace, o.signal_grace)).count()) +
                     " s of the signal; killing them (what they were saving is lost, earlier checkpoints stay)"});
      signal_all(ranks, SIGKILL);
      killed = true;
    }
    if (!all_exited && std::none_of(ranks.begin(), ranks.end(), [](const Rank& r) { return r.running; })) {
      all_exited = true;
      all_exited_at = Clock::now();
    }
  }
  print_lines(folder.flush());
  // Elastic: the job succeeded when training finished on some rank, whatever was lost on the way.
  return elastic && succeeded > 0 && !interrupted ? 0 : result;
}

// The job's id and secret, from the options or the launcher's own environment. One node makes up an id when
// none is given; several nodes cannot agree on a made-up one, so they share the unnamed job of their port.
comm::JobCredentials job_credentials(const LaunchOptions& o) {
  const char* secret = std::getenv("CROSSTRAIN_SECRET");
  comm::JobCredentials job{o.job_id.empty() ? detect_job_id(current_environment()) : o.job_id,
                           o.secret.empty() && secret ? secret : o.secret};
  const std::string problem = job_id_error(job.job_id);
  if (!job.job_id.empty() && !problem.empty()) throw UsageError("crosstrain run: " + problem);
  if (job.job_id.empty() && o.nnodes == 1) job.job_id = comm::store::new_job_id();
  return job;
}

// The launcher's elastic part: node 0's coordinator beside `store`, or the link to node 0's store elsewhere; node
// 1 also hosts the standby store (--standby). Throws UsageError when the standby's port cannot be had.
std::unique_ptr<ElasticSupervisor> elastic_supervisor(const LaunchOptions& o, int world, int port,
                                                      std::shared_ptr<comm::Rendezvous> store,
                                                      const comm::JobCredentials& job) {
  StoreAddress remote;
  if (!store) {
    remote = {o.master_addr, port, job, {}};
    for (int local = 0; local < o.nproc; ++local) remote.ranks.push_back(first_rank_of(o) + local);
  }
  Standby standby{o.standby_addr, o.standby_port, nullptr};
  if (o.standby_port > 0 && o.node_rank == 1) {
    try {
      standby.store = comm::Rendezvous::host(o.standby_addr, o.standby_port, world, o.timeout, -1, job);
    } catch (const CommError& e) {
      throw UsageError("crosstrain run: the standby store (--standby): " + e.cause());
    }
    if (job.secret.empty() && standby.store->listens_beyond_loopback())
      print_lines({comm::store::open_store_warning("crosstrain run", standby.store->listen_address())});
  }
  // Node 0's loss is what the standby is for: node 0's launcher never goes over to it, but its coordinator needs a
  // quorum once a standby exists (ElasticSupervisor). Node 0 come back (--rejoin) is a plain member at the standby.
  if (o.node_rank == 0 && o.rejoin) standby = Standby{};
  // The fewest ranks that may start it: those of the smallest MIN nodes.
  std::vector<int> sizes = o.node_sizes.empty() ? std::vector<int>(o.nnodes, o.nproc) : o.node_sizes;
  std::sort(sizes.begin(), sizes.end());
  const int min_start = std::accumulate(sizes.begin(), sizes.begin() + std::min<int>(o.elastic.min_nnodes, o.nnodes), 0);
  return std::make_unique<ElasticSupervisor>(o.elastic, world, min_start, std::move(store), remote, standby);
}

}  // namespace

std::vector<int> parse_node_sizes(const std::string& text) {
  std::vector<int> sizes;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    size_t used = 0;
    int n = 0;
    try {
      n = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || n < 1 || n > kMaxWorld)
      throw UsageError("--node-sizes '" + text + "' must be each node's ranks in node-rank order, like 2,1,1");
    sizes.push_back(n);
  }
  if (sizes.empty() || text.back() == ',')
    throw UsageError("--node-sizes '" + text + "' must be each node's ranks in node-rank order, like 2,1,1");
  return sizes;
}

int world_of(const LaunchOptions& o) {
  return o.node_sizes.empty() ? o.nproc * o.nnodes : std::accumulate(o.node_sizes.begin(), o.node_sizes.end(), 0);
}

int first_rank_of(const LaunchOptions& o) {
  if (o.node_sizes.empty()) return o.node_rank * o.nproc;
  return std::accumulate(o.node_sizes.begin(), o.node_sizes.begin() + o.node_rank, 0);
}

void parse_master(const std::string& text, std::string& host, int& port, const std::string& option) {
  auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    throw UsageError(option + " '" + text + "' must be HOST:PORT, for example 10.0.0.1:29500");
  host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  std::string port_text = text.substr(colon + 1);
  size_t used = 0;
  int value = -1;
  try {
    value = std::stoi(port_text, &used);
  } catch (const std::exception&) {
  }
  if (used != port_text.size() || value < 0 || value > 65535)
    throw UsageError(option + " '" + text + "': '" + port_text + "' is not a TCP port (0..65535)");
  port = value;
}

namespace {

// Starts this node's ranks. A SIGINT or SIGTERM while they are still starting (many of them take a while) ends the
// start at once, instead of after the last one: the ranks started so far have not begun any work worth a clean
// stop. Returns that signal (0: every rank started); throws when a rank cannot start, after stopping the others.
int start_ranks(std::vector<Rank>& ranks, const LaunchOptions& o, int world, int port, const LaunchOptions& with_job) {
  for (int local = 0; local < o.nproc; ++local) {
    if (const int sig = pending_signal(); sig != 0) {
      stop_started(ranks);
      std::cerr << "crosstrain run: got " << strsignal(sig) << " while starting rank " << first_rank_of(o) + local
                << "; stopped the " << local << " rank" << (local == 1 ? "" : "s") << " already started" << std::endl;
      return sig;
    }
    Rank& r = ranks[local];
    r.rank = first_rank_of(o) + local;
    r.local = local;
    try {
      start_rank(r, local, world, port, with_job);
    } catch (const Error& e) {
      stop_started(ranks);
      throw Error("cannot start rank " + std::to_string(r.rank) + " (" + e.what() +
                  "): a process or file limit was reached (ulimit -u, ulimit -n, or the container's pids limit); " +
                  "stopped the " + std::to_string(local) + " rank" + (local == 1 ? "" : "s") +
                  " already started. Use a smaller --nproc or raise the limit");
    }
  }
  return 0;
}

}  // namespace

namespace {

void check_node_sizes(const LaunchOptions& o) {
  if (o.node_sizes.empty()) return;
  if (static_cast<int>(o.node_sizes.size()) != o.nnodes)
    throw UsageError("--node-sizes gives " + std::to_string(o.node_sizes.size()) + " nodes but --nnodes is " +
                     std::to_string(o.nnodes) + "; give every node's ranks");
  if (o.node_sizes[static_cast<size_t>(o.node_rank)] != o.nproc)
    throw UsageError("--node-sizes gives node " + std::to_string(o.node_rank) + " " +
                     std::to_string(o.node_sizes[static_cast<size_t>(o.node_rank)]) + " ranks but --nproc is " +
                     std::to_string(o.nproc) + "; they must agree");
  int64_t world = 0;
  for (int n : o.node_sizes) world += n;
  if (world > kMaxWorld)
    throw UsageError("--node-sizes adds up to " + std::to_string(world) + " ranks, more than crosstrain supports (" +
                     std::to_string(kMaxWorld) + ")");
}

}  // namespace

static LaunchOptions with_live_store(const LaunchOptions& o);
static int run_launcher(const LaunchOptions& o);

int launch(const LaunchOptions& o) {
  if (o.nproc < 1) throw UsageError("--nproc must be at least 1, got " + std::to_string(o.nproc));
  if (o.nnodes < 1) throw UsageError("--nnodes must be at least 1, got " + std::to_string(o.nnodes));
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    throw UsageError("--node-rank " + std::to_string(o.node_rank) + " is outside 0.." + std::to_string(o.nnodes - 1));
  if (o.command.empty()) throw UsageError("no command to run; usage: crosstrain run --nproc N -- CMD ARGS...");
  if (o.nnodes > 1 && o.master_port == 0)
    throw UsageError("with several nodes every launcher needs the same --master HOST:PORT (port 0 is not allowed)");
  if (!o.standby_addr.empty() && (!o.elastic.enabled || o.nnodes < 2 || o.standby_port == 0))
    throw UsageError("--standby is for elastic jobs on several nodes (--max-restarts or --nnodes MIN:MAX, --nnodes "
                     "2 or more; node 1 hosts it) and needs a port other than 0; every launcher takes the same one");

  if (o.rejoin && (!o.elastic.enabled || o.nnodes < 2 || o.node_rank != 0))
    throw UsageError("--rejoin is for node 0 of an elastic job on several nodes, started again after the standby took "
                     "over: give --node-rank 0, --max-restarts or --nnodes MIN:MAX, and --master the standby's HOST:PORT");
  check_node_sizes(o);
  if (o.node_sizes.empty() && o.nproc > kMaxWorld / o.nnodes)
    throw UsageError("--nproc " + std::to_string(o.nproc) + " x --nnodes " + std::to_string(o.nnodes) +
                     " is more ranks than crosstrain supports (" + std::to_string(kMaxWorld) + ")");
  return run_launcher(with_live_store(o));
}

// A launcher started into a running job whose standby may hold its store by now (a scheduler starts a share with
// --master at node 0's address, and cannot know that node 0 is gone): it joins the standby once that started
// generations (asked first: a node 0 that still answers may be cut off from the others, which the standby then
// holds), else node 0's store. Until one of them answers it keeps trying, for half of --timeout (at a job's start
// node 0 may come up last; the standby's store is there from the start, but empty), then leaves it to the ranks.
static LaunchOptions with_live_store(const LaunchOptions& o) {
  if (o.standby_port <= 0 || o.node_rank == 0) return o;
  const comm::JobCredentials job = job_credentials(o);
  const auto deadline = std::chrono::steady_clock::now() + o.timeout / 2;
  for (;;) {
    if (store_answers({o.standby_addr, o.standby_port, job, {}}, world_of(o), true)) {
      // Said as it is: node 0 may still answer this node (cut off from the others only).
      const bool answers = store_answers({o.master_addr, o.master_port, job, {}}, world_of(o), false);
      std::cerr << "crosstrain run: node 0's store at " << o.master_addr << ":" << o.master_port
                << (answers ? " still answers, but" : " does not answer and") << " the standby at " << o.standby_addr
                << ":" << o.standby_port << " took the job over: this node joins it there" << std::endl;
      LaunchOptions there = o;
      there.master_addr = o.standby_addr;
      there.master_port = o.standby_port;
      return there;
    }
    if (store_answers({o.master_addr, o.master_port, job, {}}, world_of(o), false)) return o;
    if (std::chrono::steady_clock::now() >= deadline) return o;  // the ranks report that they cannot reach it
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

static int run_launcher(const LaunchOptions& o) {
  const int world = world_of(o);
  // Node 0's store serves each rank of the job on a thread of its own (nnodes per local rank), plus one that accepts.
  // Node 0 hosts the job's store, unless it comes back into a job whose standby took it over (--rejoin).
  const bool hosts_store = o.node_rank == 0 && !o.rejoin;
  RankNeeds needs = o.rank_needs;
  if (hosts_store) needs.tasks += o.nnodes;
  check_ranks_fit(o.nproc, needs, read_machine_room(), hosts_store ? 1 : 0);
  LaunchOptions with_job = o;
  const comm::JobCredentials job = job_credentials(o);
  with_job.secret = job.secret;
  with_job.job_id = job.job_id;
  std::shared_ptr<comm::Rendezvous> store;
  int port = o.master_port;
  if (hosts_store) {
    try {
      store = comm::Rendezvous::host(o.master_addr, o.master_port, world, o.timeout, -1, job);
    } catch (const CommError& e) {
      throw UsageError("crosstrain run: " + e.cause());
    }
    port = store->port();
    if (job.secret.empty() && store->listens_beyond_loopback())
      std::cerr << comm::store::open_store_warning("crosstrain run", store->listen_address()) << std::endl;
  }

  if (pipe(g_signal_pipe) != 0) throw Error("crosstrain run: pipe() failed: " + std::string(strerror(errno)));
  fcntl(g_signal_pipe[0], F_SETFL, O_NONBLOCK);
  fcntl(g_signal_pipe[1], F_SETFL, O_NONBLOCK);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  struct sigaction old_int {}, old_term {};
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  signal(SIGPIPE, SIG_IGN);
  auto restore_signals = [&] {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    close(g_signal_pipe[0]);
    close(g_signal_pipe[1]);
  };

  errno = 0;
  const int own_nice = getpriority(PRIO_PROCESS, 0);
  with_job.rank_nice = errno == 0 ? own_nice : 0;
  std::unique_ptr<ElasticSupervisor> elastic;
  if (o.elastic.enabled) {
    try {
      elastic = elastic_supervisor(o, world, port, store, job);
    } catch (const std::exception&) {
      restore_signals();
      throw;
    }
    // Every step's vote is two requests to the store this launcher serves: on a machine whose cores the ranks
    // fill, its threads would wait for a time slice. A higher priority needs privileges; without them it stays.
    if (store) raise_priority(with_job.rank_nice - 5);
  }
  std::vector<Rank> ranks(o.nproc);
  int interrupted_by = 0;
  try {
    interrupted_by = start_ranks(ranks, o, world, port, with_job);
  } catch (...) {
    restore_signals();
    throw;
  }
  if (interrupted_by != 0) {
    restore_signals();
    return 128 + interrupted_by;
  }

  const int result = supervise(ranks, with_job, elastic.get(), world, port);
  for (auto& r : ranks) {
    if (r.out.fd >= 0) close(r.out.fd);
    if (r.err.fd >= 0) close(r.err.fd);
  }
  restore_signals();
  return result;
}

int launch_self(int nproc, const std::vector<std::string>& args, std::chrono::milliseconds timeout,
                int64_t extra_bytes_per_rank, const std::string& secret, const ElasticLaunch& elastic,
                std::chrono::milliseconds signal_grace) {
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) throw Error("cannot find this program's path (/proc/self/exe)");
  exe[n] = '\0';
  LaunchOptions o;
  o.nproc = nproc;
  o.timeout = timeout;
  o.prefix_rank0_stdout = false;  // rank 0 prints the report
  o.rank_needs = kCrosstrainRank;
  o.rank_needs.bytes += extra_bytes_per_rank;
  o.secret = secret;
  o.elastic = elastic;
  o.peer_failure_signal = SIGKILL;
  o.signal_grace = signal_grace;
  o.command.push_back(exe);
  o.command.insert(o.command.end(), args.begin(), args.end());
  return launch(o);
}

}  // namespace crosstrain::apps
