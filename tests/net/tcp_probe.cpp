// tcp_probe: measures a TCP path between two hosts of the emulated testbed (tests/net).
//
//   tcp_probe serve   --port P [--bind ADDR] [--max-seconds S]
//   tcp_probe rtt     --host H --port P [--count N] [--size BYTES]          round trips of small messages
//   tcp_probe bulk    --host H --port P --bytes N                           one bulk transfer, client to server
//   tcp_probe connect --host H --port P                                     one connection and one round trip
//   common: --timeout-ms T (connect and each read/write; default 5000)
//
// Results are printed as `key=value` lines; the exit status is 0 on success, 1 when the peer cannot be reached
// or the exchange fails, 2 on bad arguments. The server echoes ('E' connections) or counts what it receives
// until EOF and answers with the count ('S' connections); one thread per connection.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string mode, host = "127.0.0.1", bind = "0.0.0.0";
  int port = 0;
  int count = 20;
  size_t size = 64;
  uint64_t bytes = 16 << 20;
  int timeout_ms = 5000;
  double max_seconds = 600;
};

[[noreturn]] void die(int code, const std::string& msg) {
  std::fprintf(stderr, "tcp_probe: %s\n", msg.c_str());
  std::exit(code);
}

std::string err(const std::string& what) { return what + ": " + std::strerror(errno); }

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Waits for `events` on fd until the deadline; false on timeout.
bool wait_for(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    int r = poll(&p, 1, int(left));
    if (r > 0) return true;
    if (r < 0 && errno != EINTR) return false;
  }
}

bool write_all(int fd, const void* data, size_t n, int timeout_ms) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w, n -= size_t(w);
      continue;
    }
    if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!wait_for(fd, POLLOUT, Clock::now() + std::chrono::milliseconds(timeout_ms))) return false;
      continue;
    }
    return false;
  }
  return true;
}

bool read_all(int fd, void* data, size_t n, int timeout_ms) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    ssize_t r = recv(fd, p, n, 0);
    if (r > 0) {
      p += r, n -= size_t(r);
      continue;
    }
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!wait_for(fd, POLLIN, Clock::now() + std::chrono::milliseconds(timeout_ms))) return false;
      continue;
    }
    return false;  // EOF or error
  }
  return true;
}

void set_nonblocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// Connects within the timeout; a refused connection is retried (the server may still be starting).
int connect_to(const Args& a) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(a.port));
  if (inet_pton(AF_INET, a.host.c_str(), &addr.sin_addr) != 1) {
    addrinfo hints{}, *res = nullptr;
    hints.ai_family = AF_INET;
    if (getaddrinfo(a.host.c_str(), nullptr, &hints, &res) != 0 || !res) die(1, "cannot resolve " + a.host);
    addr.sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
    freeaddrinfo(res);
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(a.timeout_ms);
  std::string last = "timed out";
  while (Clock::now() < deadline) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) die(1, err("socket"));
    set_nonblocking(fd);
    int r = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    if (r < 0 && errno != EINPROGRESS) {
      last = err("connect");
      close(fd);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    if (r < 0 && !wait_for(fd, POLLOUT, deadline)) {
      close(fd);
      last = "timed out";
      break;
    }
    int soerr = 0;
    socklen_t len = sizeof soerr;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
    if (soerr == 0) return fd;
    errno = soerr;
    last = err("connect");
    close(fd);
    if (soerr != ECONNREFUSED) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::fprintf(stderr, "tcp_probe: cannot connect to %s:%d within %d ms (%s)\n", a.host.c_str(), a.port, a.timeout_ms,
               last.c_str());
  std::exit(1);
}

void serve_connection(int fd, int timeout_ms) {
  char mode = 0;
  if (!read_all(fd, &mode, 1, timeout_ms)) return void(close(fd));
  std::vector<char> buf(1 << 18);
  if (mode == 'E') {
    for (;;) {
      ssize_t r = recv(fd, buf.data(), buf.size(), 0);
      if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
        if (!wait_for(fd, POLLIN, Clock::now() + std::chrono::seconds(600))) break;
        continue;
      }
      if (r <= 0 || !write_all(fd, buf.data(), size_t(r), timeout_ms)) break;
    }
  } else if (mode == 'S') {
    uint64_t total = 0;
    for (;;) {
      ssize_t r = recv(fd, buf.data(), buf.size(), 0);
      if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
        if (!wait_for(fd, POLLIN, Clock::now() + std::chrono::milliseconds(timeout_ms))) break;
        continue;
      }
      if (r < 0) break;
      if (r == 0) {
        write_all(fd, &total, sizeof total, timeout_ms);
        break;
      }
      total += uint64_t(r);
    }
  }
  close(fd);
}

int serve(const Args& a) {
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(a.port));
  if (inet_pton(AF_INET, a.bind.c_str(), &addr.sin_addr) != 1) die(2, "bad --bind address " + a.bind);
  if (bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0) die(1, err("bind"));
  if (listen(lfd, 64) < 0) die(1, err("listen"));
  std::fprintf(stdout, "listening=%s:%d\n", a.bind.c_str(), a.port);
  std::fflush(stdout);
  const auto deadline = Clock::now() + std::chrono::duration<double>(a.max_seconds);
  while (wait_for(lfd, POLLIN, std::chrono::time_point_cast<Clock::duration>(deadline))) {
    int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) continue;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::thread(serve_connection, fd, a.timeout_ms).detach();
  }
  return 0;
}

int rtt(const Args& a) {
  int fd = connect_to(a);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (!write_all(fd, "E", 1, a.timeout_ms)) die(1, "cannot start the echo exchange");
  std::vector<char> out(std::max<size_t>(a.size, 1), 'x'), in(out.size());
  std::vector<double> rtts;
  for (int i = 0; i < a.count; ++i) {
    auto t0 = Clock::now();
    if (!write_all(fd, out.data(), out.size(), a.timeout_ms) || !read_all(fd, in.data(), in.size(), a.timeout_ms))
      die(1, "echo round trip " + std::to_string(i) + " failed or timed out");
    rtts.push_back(ms_since(t0));
  }
  close(fd);
  std::sort(rtts.begin(), rtts.end());
  std::printf("rtt_ms_min=%.3f\nrtt_ms_median=%.3f\nrtt_ms_max=%.3f\ncount=%d\n", rtts.front(), rtts[rtts.size() / 2],
              rtts.back(), a.count);
  return 0;
}

int bulk(const Args& a) {
  int fd = connect_to(a);
  if (!write_all(fd, "S", 1, a.timeout_ms)) die(1, "cannot start the bulk transfer");
  std::vector<char> chunk(1 << 18, 'b');
  auto t0 = Clock::now();
  uint64_t left = a.bytes;
  while (left > 0) {
    size_t n = size_t(std::min<uint64_t>(left, chunk.size()));
    if (!write_all(fd, chunk.data(), n, a.timeout_ms)) die(1, "bulk write failed or timed out");
    left -= n;
  }
  shutdown(fd, SHUT_WR);
  uint64_t received = 0;
  if (!read_all(fd, &received, sizeof received, a.timeout_ms)) die(1, "no byte count from the server");
  double s = ms_since(t0) / 1000;
  close(fd);
  if (received != a.bytes)
    die(1, "server received " + std::to_string(received) + " bytes of " + std::to_string(a.bytes));
  std::printf("bytes=%llu\nseconds=%.4f\nmbit_s=%.2f\n", (unsigned long long)a.bytes, s, a.bytes * 8 / s / 1e6);
  return 0;
}

int connect_once(const Args& a) {
  auto t0 = Clock::now();
  int fd = connect_to(a);
  char in[2];
  if (!write_all(fd, "Ex", 2, a.timeout_ms) || !read_all(fd, in, 1, a.timeout_ms))
    die(1, "connected, but no echo within the timeout");
  close(fd);
  std::printf("connected_ms=%.3f\n", ms_since(t0));
  return 0;
}

Args parse(int argc, char** argv) {
  if (argc < 2) die(2, "usage: tcp_probe serve|rtt|bulk|connect [options] (see the top of tcp_probe.cpp)");
  Args a;
  a.mode = argv[1];
  for (int i = 2; i < argc; ++i) {
    std::string k = argv[i];
    if (i + 1 >= argc) die(2, k + " needs a value");
    std::string v = argv[++i];
    try {
      if (k == "--host") a.host = v;
      else if (k == "--bind") a.bind = v;
      else if (k == "--port") a.port = std::stoi(v);
      else if (k == "--count") a.count = std::stoi(v);
      else if (k == "--size") a.size = std::stoul(v);
      else if (k == "--bytes") a.bytes = std::stoull(v);
      else if (k == "--timeout-ms") a.timeout_ms = std::stoi(v);
      else if (k == "--max-seconds") a.max_seconds = std::stod(v);
      else die(2, "unknown option " + k);
    } catch (const std::logic_error&) {
      die(2, "bad value '" + v + "' for " + k);
    }
  }
  if (a.port <= 0 || a.port > 65535) die(2, "--port is required (1..65535)");
  if (a.count < 1) die(2, "--count must be positive");
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  signal(SIGPIPE, SIG_IGN);
  Args a = parse(argc, argv);
  if (a.mode == "serve") return serve(a);
  if (a.mode == "rtt") return rtt(a);
  if (a.mode == "bulk") return bulk(a);
  if (a.mode == "connect") return connect_once(a);
  die(2, "unknown mode '" + a.mode + "' (serve, rtt, bulk, connect)");
}
