// Rendezvous: the key-value store through which ranks find each other (crosstrain's own store: store_server.h,
// store_client.h; c10d's TCPStore serves one client at a time and listens on every interface).
// The launcher of node 0 (or rank 0, when started by mpirun/srun) hosts it; nothing external is needed.
#pragma once

#include <memory>
#include <string>

#include "crosstrain/comm/communicator.h"

namespace c10d {
class Store;
}

namespace crosstrain::comm {

class Rendezvous {
 public:
  // Hosts the store for a job of `world_size` ranks on host:port, listening on that address only (port 0 picks
  // a free one). `rank` >= 0: this process is that rank and uses the store in-process. Throws CommError when
  // the address cannot be bound (port taken, address not this machine's).
  static std::shared_ptr<Rendezvous> host(const std::string& host, int port, int world_size, Millis timeout,
                                          int rank = -1);
  // Connects to a store hosted elsewhere as `rank` of `world_size`; fails within `timeout` naming the address,
  // or at once when the store belongs to another job or the rank is already taken.
  static std::shared_ptr<Rendezvous> connect(const std::string& host, int port, int rank, int world_size,
                                             Millis timeout);

  ~Rendezvous();
  const std::string& address() const { return address_; }
  int port() const { return port_; }
  // The underlying c10d store (for back ends).
  c10::intrusive_ptr<c10d::Store> store() const;

  struct Impl;

 private:
  Rendezvous(std::unique_ptr<Impl> impl, std::string address, int port);
  std::unique_ptr<Impl> impl_;
  std::string address_;
  int port_;
};

}  // namespace crosstrain::comm
