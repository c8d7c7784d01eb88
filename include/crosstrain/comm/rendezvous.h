// Rendezvous: the key-value store through which ranks find each other (crosstrain's own store: store_server.h,
// store_client.h; c10d's TCPStore serves one client at a time and listens on every interface).
// The launcher of node 0 (or rank 0, when started by mpirun/srun) hosts it; nothing external is needed.
#pragma once

#include <memory>
#include <string>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/store/auth.h"

namespace c10d {
class Store;
}

namespace crosstrain::comm {

// `job` names the job and holds its secret (store_auth.h): the store admits only clients of that job id that
// prove the secret (when there is one), and store() is a c10d PrefixStore under the job id, so the keys of two
// jobs never mix.
class Rendezvous {
 public:
  // Hosts the store for a job of `world_size` ranks on host:port, listening on that address only (port 0 picks
  // a free one). `rank` >= 0: this process is that rank and uses the store in-process. Throws CommError when
  // the address cannot be bound (port taken, address not this machine's).
  static std::shared_ptr<Rendezvous> host(const std::string& host, int port, int world_size, Millis timeout,
                                          int rank = -1, const JobCredentials& job = {});
  // Connects to a store hosted elsewhere as `rank` of `world_size`; fails within `timeout` naming the address,
  // or at once when the store belongs to another job, the rank is already taken, or the secrets differ.
  static std::shared_ptr<Rendezvous> connect(const std::string& host, int port, int rank, int world_size,
                                             Millis timeout, const JobCredentials& job = {});

  ~Rendezvous();
  const std::string& address() const { return address_; }
  int port() const { return port_; }
  // When this process hosts the store: whether peers beyond this machine can reach it (false when it connects).
  bool listens_beyond_loopback() const;
  // The addresses the hosted store listens on ("0.0.0.0:29500"); the address connected to otherwise.
  std::string listen_address() const;
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
