#include "crosstrain/store/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <system_error>

#include "crosstrain/store/address.h"

namespace crosstrain::comm::store {

namespace {

using AddrList = std::unique_ptr<addrinfo, decltype(&freeaddrinfo)>;

AddrList resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* list = nullptr;
  const std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &list);
  if (rc != 0)
    throw std::system_error(std::make_error_code(std::errc::invalid_argument),
                            "cannot resolve '" + host + "': " + gai_strerror(rc));
  return AddrList(list, &freeaddrinfo);
}

// Milliseconds poll() may wait under `p`: -1 for ever, 0 when the deadline has passed.
int poll_budget(const Patience& p) {
  int64_t ms = p.stall == Millis::max() ? -1 : p.stall.count();
  if (p.at != Clock::time_point::max()) {
    auto left = std::chrono::duration_cast<Millis>(p.at - Clock::now()).count() + 1;
    left = std::max<int64_t>(left, 0);
    ms = ms < 0 ? left : std::min(ms, left);
  }
  return static_cast<int>(std::min<int64_t>(ms, 1 << 30));
}

Io wait_for(int fd, short events, const Patience& p) {
  for (;;) {
    pollfd pfd{fd, events, 0};
    int rc = poll(&pfd, 1, poll_budget(p));
    if (rc > 0) return Io::Done;  // also on POLLHUP/POLLERR: the next read or write reports it
    if (rc == 0) return Io::TimedOut;
    if (errno != EINTR) return Io::Failed;
  }
}

}  // namespace

std::string endpoint(const std::string& host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

namespace {

// The numeric host and port of one end of a socket (getsockname or getpeername); false when unknown.
bool socket_end(int fd, bool peer, std::string& host, int& port) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  const int rc = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len)
                      : getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  if (rc != 0) return false;
  char name[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, name, sizeof name, serv, sizeof serv,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  host = name;
  port = std::atoi(serv);
  return true;
}

}  // namespace

std::string local_address(int fd) {
  std::string host;
  int port = 0;
  return socket_end(fd, false, host, port) ? endpoint(host, port) : "?";
}

std::string peer_address(int fd) {
  std::string host;
  int port = 0;
  return socket_end(fd, true, host, port) ? endpoint(host, port) : "an unknown address";
}

bool loopback_only(const std::vector<int>& listen_fds) {
  for (int fd : listen_fds) {
    std::string host;
    int port = 0;
    if (!socket_end(fd, false, host, port) || !is_loopback_address(host)) return false;
  }
  return true;
}

namespace {

// The numeric addresses `host` resolves to, in resolution order (the empty name: the wildcard addresses).
std::vector<std::string> numeric_addresses(const std::string& host, int port) {
  AddrList list = resolve(host, port, host.empty());
  std::vector<std::string> out;
  for (addrinfo* a = list.get(); a; a = a->ai_next) {
    char name[NI_MAXHOST];
    if (getnameinfo(a->ai_addr, a->ai_addrlen, name, sizeof name, nullptr, 0, NI_NUMERICHOST) == 0)
      out.push_back(name);
  }
  return out;
}

// A listening socket on numeric:port, or -1 with errno set.
int listen_one(const std::string& numeric, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICHOST | AI_PASSIVE;
  addrinfo* a = nullptr;
  if (getaddrinfo(numeric.c_str(), std::to_string(port).c_str(), &hints, &a) != 0) {
    errno = EADDRNOTAVAIL;
    return -1;
  }
  AddrList owned(a, &freeaddrinfo);
  int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  // Each address gets its own socket: "::" must not also claim IPv4, or binding "0.0.0.0" next would fail.
  if (a->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
  if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 512) == 0) return fd;
  const int saved = errno;
  close(fd);
  errno = saved;
  return -1;
}

int bound_port(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  return ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
}

}  // namespace

Listeners listen_on(const std::string& host, int& port) {
  ListenPlan plan = plan_listen(host, numeric_addresses(host, port));
  Listeners out;
  out.note = plan.note;
  int last_errno = EADDRNOTAVAIL;
  for (const auto& address : plan.addresses) {
    int fd = listen_one(address, port);
    if (fd < 0) {
      last_errno = errno;
      if (last_errno == EADDRINUSE) break;  // the port is taken: the caller says so, whatever else bound
      continue;                             // e.g. a stale /etc/hosts entry that is not this machine's
    }
    if (port == 0) port = bound_port(fd);  // the other addresses get the same port
    out.fds.push_back(fd);
  }
  if (last_errno == EADDRINUSE || out.fds.empty()) {
    for (int fd : out.fds) close(fd);
    throw std::system_error(last_errno, std::generic_category(), "cannot listen on " + endpoint(host, port));
  }
  return out;
}

int connect_to(const std::string& host, int port, Clock::time_point deadline, std::string& error) {
  AddrList list(nullptr, &freeaddrinfo);
  try {
    list = resolve(host, port, false);
  } catch (const std::system_error& e) {
    error = e.what();
    return -1;
  }
  for (addrinfo* a = list.get(); a; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) { error = strerror(errno); continue; }
    int rc = connect(fd, a->ai_addr, a->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      Patience p;
      p.at = deadline;
      if (wait_for(fd, POLLOUT, p) == Io::Done) {
        int so_error = 0;
        socklen_t len = sizeof so_error;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len);
        rc = so_error == 0 ? 0 : -1;
        errno = so_error;
      } else {
        errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // small request/reply messages
      return fd;
    }
    error = strerror(errno);
    close(fd);
  }
  return -1;
}

Io read_exact(int fd, void* buffer, size_t size, Patience patience) {
  auto* p = static_cast<uint8_t*>(buffer);
  while (size > 0) {
    Io ready = wait_for(fd, POLLIN, patience);
    if (ready != Io::Done) return ready;
    ssize_t n = recv(fd, p, size, MSG_DONTWAIT);
    if (n == 0) return Io::Closed;
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return errno == ECONNRESET ? Io::Closed : Io::Failed;
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Io::Done;
}

Io write_all(int fd, const void* buffer, size_t size, Patience patience) {
  const auto* p = static_cast<const uint8_t*>(buffer);
  while (size > 0) {
    Io ready = wait_for(fd, POLLOUT, patience);
    if (ready != Io::Done) return ready;
    // MSG_NOSIGNAL: a peer that went away must not kill the launcher with SIGPIPE.
    ssize_t n = send(fd, p, size, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      return errno == EPIPE || errno == ECONNRESET ? Io::Closed : Io::Failed;
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Io::Done;
}

Io wait_readable(int fd, Patience patience) { return wait_for(fd, POLLIN, patience); }

}  // namespace crosstrain::comm::store
