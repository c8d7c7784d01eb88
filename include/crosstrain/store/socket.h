// Socket plumbing of the rendezvous store: listen on the addresses of a name, connect with a deadline, and reads/writes
// that never wait longer than told. Internal to src/comm.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <vector>

namespace crosstrain::comm::store {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

enum class Io { Done, Closed, TimedOut, Failed };

// How long an I/O call may take: until `at` in all, and at most `stall` without any byte moving.
struct Patience {
  Clock::time_point at = Clock::time_point::max();
  Millis stall = Millis::max();
};

struct Listeners {
  std::vector<int> fds;  // one listening socket per address
  std::string note;      // plan_listen's log line, when it widened the addresses; else ""
};
// Binds host:port (port 0: any free one, the same on every address) on the addresses plan_listen chooses from
// what `host` resolves to: every one of them, an IP literal exactly, and the wildcard for a machine name that
// resolves only to loopback. Sets `port` to the port bound. Addresses that are not this machine's are skipped
// while another binds; throws std::system_error when the port is taken on any of them (EADDRINUSE) or
// nothing could be bound.
Listeners listen_on(const std::string& host, int& port);
// One connection attempt to every address of host:port in turn, each bounded by `deadline`.
// Returns the socket, or -1 with `error` set.
int connect_to(const std::string& host, int port, Clock::time_point deadline, std::string& error);

Io read_exact(int fd, void* buffer, size_t size, Patience patience);
Io write_all(int fd, const void* buffer, size_t size, Patience patience);
// Blocks until the socket is readable or closed (or `patience` runs out).
Io wait_readable(int fd, Patience patience);

// "host:port", with brackets around an IPv6 literal.
std::string endpoint(const std::string& host, int port);
// The local address a socket is bound to ("127.0.0.1:29500").
std::string local_address(int fd);
// The address of the peer of a connected socket ("127.0.0.1:41234").
std::string peer_address(int fd);
// Whether every listening socket is bound to a loopback address (nothing beyond this machine can connect).
bool loopback_only(const std::vector<int>& listen_fds);

}  // namespace crosstrain::comm::store
