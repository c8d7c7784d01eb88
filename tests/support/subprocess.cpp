#include "subprocess.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <stdexcept>

namespace crosstrain::testing {

int ProcessResult::exit_code() const {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

Process::Process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env) {
  int fds[2];
  if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
  start_ = std::chrono::steady_clock::now();
  pid_ = fork();
  if (pid_ == 0) {
    setpgid(0, 0);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    // Only stdout and stderr hold the pipe: a daemon the command starts (and that closes its stdio) must not keep
    // it open, or waiting for the output's end would wait for the daemon.
    if (fds[1] > STDERR_FILENO) close(fds[1]);
    for (const auto& [k, v] : env) {
      if (v.empty()) unsetenv(k.c_str());
      else setenv(k.c_str(), v.c_str(), 1);
    }
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  fd_ = fds[0];
  fcntl(fd_, F_SETFL, O_NONBLOCK);
}

Process::~Process() {
  if (pid_ > 0) {
    kill(-pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (fd_ >= 0) close(fd_);
}

void Process::signal(int sig) { kill(pid_, sig); }

bool Process::wait_for_output(const std::string& text, std::chrono::milliseconds deadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  while (output_.find(text) == std::string::npos) {
    if (std::chrono::steady_clock::now() > until) return false;
    pollfd p{fd_, POLLIN, 0};
    poll(&p, 1, 50);
    char buf[4096];
    ssize_t n;
    while ((n = read(fd_, buf, sizeof buf)) > 0) output_.append(buf, static_cast<size_t>(n));
  }
  return true;
}

ProcessResult Process::wait(std::chrono::milliseconds deadline) {
  ProcessResult result;
  auto until = start_ + deadline;
  bool exited = false;
  while (true) {
    pollfd p{fd_, POLLIN, 0};
    poll(&p, 1, 50);
    char buf[4096];
    ssize_t n;
    while ((n = read(fd_, buf, sizeof buf)) > 0) output_.append(buf, static_cast<size_t>(n));
    if (!exited && waitpid(pid_, &result.status, WNOHANG) == pid_) exited = true;
    if (exited && n == 0) break;  // exited and the pipe is drained
    if (exited && std::chrono::steady_clock::now() > until + std::chrono::seconds(2)) break;
    if (!exited && std::chrono::steady_clock::now() > until) {
      result.timed_out = true;
      kill(-pid_, SIGKILL);
      kill(pid_, SIGKILL);
      waitpid(pid_, &result.status, 0);
      exited = true;
    }
  }
  pid_ = -1;
  result.output = output_;
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  return result;
}

ProcessResult run_process(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env,
                          std::chrono::milliseconds deadline) {
  Process p(argv, env);
  return p.wait(deadline);
}

ProcessResult run_shell(const std::string& command, std::chrono::milliseconds deadline) {
  return run_process({"/bin/sh", "-c", command}, {}, deadline);
}

int free_port() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  close(s);
  return port;
}

std::map<std::string, std::string> launched_rank_env(int rank, int world, int port, int timeout_ms,
                                                     bool launcher_hosts_store) {
  return {{"RANK", std::to_string(rank)},      {"WORLD_SIZE", std::to_string(world)},
          {"MASTER_ADDR", "127.0.0.1"},        {"MASTER_PORT", std::to_string(port)},
          {"CT_TIMEOUT_MS", std::to_string(timeout_ms)}, {"OMP_NUM_THREADS", "1"},
          {"TORCHELASTIC_USE_AGENT_STORE", launcher_hosts_store ? "True" : ""}};
}

}  // namespace crosstrain::testing
