// The rendezvous store's server: the launcher of node 0 (or rank 0) hosts it for the ranks of one job.
//
// One thread per connection, so a slow or hostile client never delays the others. A connection must send the
// preamble and an admissible Hello (same world size, a free rank) within `handshake_timeout`, and may send no
// more than store::kMaxHelloBytes before that; once admitted, a message it has started must keep arriving
// (no `stall_timeout` without a byte) or the connection is dropped. Idle admitted connections stay: ranks
// hold theirs for the whole job. The server binds to the address it is given, never to every interface.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "crosstrain/comm/store_table.h"

namespace crosstrain::comm::store {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  int world_size = 1;
  std::chrono::milliseconds handshake_timeout{5000};
  std::chrono::milliseconds stall_timeout{5000};
  size_t max_connections = 1024;  // beyond this a new connection is closed at once
};

class StoreServer {
 public:
  // Listens at once; throws std::system_error when the address cannot be bound (errc::address_in_use ...).
  explicit StoreServer(ServerOptions options);
  // Closes the listener and every connection (a stalled client does not delay it) and joins all threads.
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  int port() const { return port_; }
  // The listening socket's own address, e.g. "127.0.0.1:29500".
  const std::string& bound_address() const { return bound_address_; }
  const std::shared_ptr<StoreTable>& table() const { return table_; }
  // Marks `rank` as present without a connection: the hosting process is that rank and uses the table directly.
  void claim_rank(int rank);
  // Connections currently open (admitted or not); for tests and diagnostics.
  size_t connections() const;

 private:
  struct Connection {
    int fd = -1;
    int rank = -1;
    std::thread thread;
    std::atomic<bool> done{false};
  };

  void accept_loop();
  void serve(Connection& c);
  bool admit(Connection& c);                        // preamble + Hello; false drops the connection
  Message handle(const Message& request);           // one admitted request
  bool send(Connection& c, const Message& message);
  void reap(bool all);                              // joins finished connection threads, closes their sockets

  ServerOptions options_;
  std::shared_ptr<StoreTable> table_ = std::make_shared<StoreTable>();
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // a pipe that wakes the accept loop at shutdown
  int port_ = 0;
  std::string bound_address_;
  std::atomic<bool> stopping_{false};
  mutable std::mutex mu_;  // guards connections_ and ranks_
  std::vector<std::unique_ptr<Connection>> connections_;
  std::set<int> ranks_;
  std::thread acceptor_;
};

}  // namespace crosstrain::comm::store
