// The rendezvous store's server: the launcher of node 0 (or rank 0) hosts it for the ranks of one job.
//
// One thread per connection, so a slow or hostile client never delays the others. A connection must send the
// preamble and an admissible Hello (same world size, a free rank) within `handshake_timeout`, and may send no
// more than store::kMaxHelloBytes before that. Once admitted, a message it has started must keep arriving (no
// `stall_timeout` without a byte) and be complete within `message_timeout`, or the connection is dropped.
// Idle admitted connections stay: ranks hold theirs for the whole job. Tools and probes (rank -1) are limited
// to `max_probes` connections and store::kMaxProbeFrameBytes per message. Memory follows the bytes that
// actually arrive, within `max_in_flight_bytes` over all connections. A wait (get, wait) lasts at most
// `max_wait` and ends early when its client hangs up. The server listens on the addresses of the name it is
// given (store_address.h), never on every interface unless that name resolves to loopback only.
// A client of another job id is refused; when the job has a secret, a client must also prove it (store_auth.h).
// Each such refusal prints one line on stderr naming the peer's address and why, at most a few a minute.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "crosstrain/store/auth.h"
#include "crosstrain/store/table.h"

namespace crosstrain::comm::store {

class ByteBudget;
struct Patience;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  int world_size = 1;
  JobCredentials job;  // the job id every client must name, and the secret it must prove (none when empty)
  std::chrono::milliseconds handshake_timeout{5000};
  std::chrono::milliseconds stall_timeout{5000};
  std::chrono::milliseconds message_timeout{30000};  // a whole message, however steadily it trickles in
  std::chrono::milliseconds max_wait{300000};        // the longest get/wait; the job's timeout in Rendezvous
  // Beyond this a new connection displaces the oldest one still in its handshake (a client that connects and says
  // nothing cannot hold the slots that ranks need), or is closed at once when every connection was admitted.
  size_t max_connections = 1024;
  size_t max_probes = 8;          // admitted rank -1 connections
  size_t max_in_flight_bytes = size_t{256} << 20;  // request bytes held at once, all connections together
  // How connection threads are started (std::thread when empty). Tests make it throw, as a process limit does.
  std::function<std::thread(std::function<void()>)> start_thread;
};

class StoreServer {
 public:
  // Listens at once; throws std::system_error when the address cannot be bound (errc::address_in_use ...) or
  // the accepting thread cannot start; nothing is left open then.
  explicit StoreServer(ServerOptions options);
  // Closes the listener and every connection (a stalled client does not delay it) and joins all threads.
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }
  // The listening sockets' own addresses, e.g. "127.0.0.1:29500" (comma-separated when several).
  const std::string& bound_address() const { return bound_address_; }
  const std::shared_ptr<StoreTable>& table() const { return table_; }
  // Marks `rank` as present without a connection: the hosting process is that rank and uses the table directly.
  void claim_rank(int rank);
  // Connections currently open (admitted or not); for tests and diagnostics.
  size_t connections() const;
  // Request bytes held in memory now, over all connections; for tests and diagnostics.
  size_t bytes_in_flight() const;
  // Whether it listens on loopback addresses only (nothing beyond this machine can reach it).
  bool loopback_only() const { return loopback_only_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Connection {
    int fd = -1;
    int rank = -1;
    bool probe = false;  // an admitted rank -1
    size_t max_frame = 0;
    std::unique_ptr<SessionSealer> session;  // with a secret: seals every frame after the handshake
    std::atomic<bool> admitted{false};        // past the handshake
    bool displaced = false;                   // shut down to make room (under mu_)
    std::thread thread;
    std::atomic<bool> done{false};
  };

  std::thread start(std::function<void()> body);
  void accept_loop();
  void accept_one(int listen_fd);
  void serve(Connection& c);
  bool admit(Connection& c);                                         // preamble + Hello; false drops it
  std::string admit_under_lock(Connection& c, const Hello& hello);
  // The challenge-response when the job has a secret: "" once proven, else the reason for the client; sets
  // `dropped` when the client went away or broke the protocol (then nothing is sent back).
  std::string authenticate(Connection& c, const Hello& hello, const std::string& server_nonce, const Patience& p,
                           bool& dropped);
  void log_refusal(const Connection& c, const std::string& why);
  std::optional<Message> handle(Connection& c, const Message& request);  // nullopt: the client hung up
  std::optional<bool> wait_while_connected(Connection& c, int64_t wait_ms,
                                           const std::function<bool(Clock::time_point)>& until);
  bool send(Connection& c, const Message& message, Clock::time_point deadline);
  void release(Connection& c);                     // gives back the rank or probe slot of a finished connection
  void reap(bool all);                             // joins finished connection threads, closes their sockets
  void close_descriptors();

  ServerOptions options_;
  std::shared_ptr<StoreTable> table_ = std::make_shared<StoreTable>();
  std::unique_ptr<ByteBudget> budget_;
  std::vector<int> listen_fds_;
  int wake_[2] = {-1, -1};  // a pipe that wakes the accept loop at shutdown
  int port_ = 0;
  std::string bound_address_;
  bool loopback_only_ = true;
  std::mutex log_mu_;  // guards refusals_
  RefusalLog refusals_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> thread_failure_logged_{false};
  mutable std::mutex mu_;  // guards connections_, ranks_ and probes_
  std::vector<std::unique_ptr<Connection>> connections_;
  std::set<int> ranks_;
  size_t probes_ = 0;
  std::thread acceptor_;
};

}  // namespace crosstrain::comm::store
