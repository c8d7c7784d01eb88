// Socket plumbing of the rendezvous store: listen on one address, connect with a deadline, and reads/writes
// that never wait longer than told. Internal to src/comm.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace crosstrain::comm::store {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

enum class Io { Done, Closed, TimedOut, Failed };

// How long an I/O call may take: until `at` in all, and at most `stall` without any byte moving.
struct Patience {
  Clock::time_point at = Clock::time_point::max();
  Millis stall = Millis::max();
};

// Binds host:port (port 0: any free one) on exactly the addresses `host` resolves to, not on every interface.
// Returns the listening socket; sets `port` to the port bound. Throws std::system_error (EADDRINUSE ...).
int listen_on(const std::string& host, int& port);
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

}  // namespace crosstrain::comm::store
