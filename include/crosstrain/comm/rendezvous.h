// Rendezvous: the key-value store through which ranks find each other (c10d's TCPStore).
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
  // Hosts the store on host:port (port 0 picks a free one). Throws CommError when the port is taken.
  static std::shared_ptr<Rendezvous> host(const std::string& host, int port, int world_size, Millis timeout);
  // Connects to a store hosted elsewhere; fails within `timeout` naming the address it tried.
  static std::shared_ptr<Rendezvous> connect(const std::string& host, int port, int rank, Millis timeout);

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
