#include "crosstrain/comm/rendezvous.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <system_error>

#include "crosstrain/store/local_store.h"
#include "crosstrain/store/client.h"
#include "crosstrain/store/server.h"
#include "crosstrain/store/socket.h"

namespace crosstrain::comm {

struct Rendezvous::Impl {
  std::unique_ptr<store::StoreServer> server;  // when this process hosts the store
  c10::intrusive_ptr<c10d::Store> store;
};

namespace {

using store::endpoint;

std::string hosting_problem(const std::system_error& e, const std::string& host, int port) {
  if (e.code() == std::errc::address_in_use)
    return "port " + std::to_string(port) + " is already in use; choose another with --master HOST:PORT (or " +
           "MASTER_PORT), or stop the process holding it";
  if (e.code() == std::errc::address_not_available)
    return "cannot host the rendezvous store on " + endpoint(host, port) + ": that address is not one of this " +
           "machine's (--master / MASTER_ADDR must name node 0)";
  if (e.code() == std::errc::resource_unavailable_try_again)
    return "cannot host the rendezvous store on " + endpoint(host, port) + ": cannot start its thread (" +
           e.what() + "); the process limit is reached: raise it (ulimit -u, the container's pids limit) or " +
           "stop other processes";
  return "cannot host the rendezvous store on " + endpoint(host, port) + ": " + e.what();
}

// The job's own namespace on the store: c10d's PrefixStore, as torchelastic does with its run id.
c10::intrusive_ptr<c10d::Store> under_job(c10::intrusive_ptr<c10d::Store> store, const JobCredentials& job) {
  if (job.job_id.empty()) return store;
  return c10::make_intrusive<c10d::PrefixStore>("crosstrain/job/" + job.job_id, std::move(store));
}

}  // namespace

Rendezvous::Rendezvous(std::unique_ptr<Impl> impl, std::string address, int port)
    : impl_(std::move(impl)), address_(std::move(address)), port_(port) {}

Rendezvous::~Rendezvous() = default;

c10::intrusive_ptr<c10d::Store> Rendezvous::store() const { return impl_->store; }

bool Rendezvous::listens_beyond_loopback() const { return impl_->server && !impl_->server->loopback_only(); }

std::string Rendezvous::listen_address() const {
  return impl_->server ? impl_->server->bound_address() : endpoint(address_, port_);
}

std::shared_ptr<Rendezvous> Rendezvous::host(const std::string& host, int port, int world_size, Millis timeout,
                                             int rank, const JobCredentials& job) {
  store::ServerOptions options;
  options.job = job;
  options.host = host;
  options.port = port;
  options.world_size = world_size;
  options.max_wait = timeout;  // no get or wait on the server outlasts the job's own timeout
  // One connection per rank, with room for probes: a large job must never be turned away.
  options.max_connections = std::max<size_t>(options.max_connections, 5 * static_cast<size_t>(world_size) + 64);
  // Elastic ranks hold three light connections each (heartbeat, generation watcher, step voter) beside their own,
  // and the launcher of each other node one (exits and exclusions).
  options.max_probes = std::max<size_t>(options.max_probes, 4 * static_cast<size_t>(world_size) + 8);
  auto impl = std::make_unique<Impl>();
  try {
    impl->server = std::make_unique<store::StoreServer>(options);
  } catch (const std::system_error& e) {
    CommContext c;
    c.rank = rank;
    c.op = "rendezvous";
    throw CommError(c, hosting_problem(e, host, port));
  }
  const int bound = impl->server->port();
  if (rank >= 0) impl->server->claim_rank(rank);
  impl->store = under_job(
      c10::make_intrusive<store::LocalStore>(impl->server->table(), endpoint(host, bound), rank, timeout), job);
  return std::shared_ptr<Rendezvous>(new Rendezvous(std::move(impl), host, bound));
}

std::shared_ptr<Rendezvous> Rendezvous::connect(const std::string& host, int port, int rank, int world_size,
                                                Millis timeout, const JobCredentials& job) {
  store::Hello hello;
  hello.rank = rank;
  hello.world_size = world_size;
  hello.job = job.job_id;
  auto impl = std::make_unique<Impl>();
  // Throws CommError: unreachable, refused, or a store that does not prove the job's secret.
  impl->store = under_job(c10::make_intrusive<store::StoreClient>(host, port, hello, timeout, job.secret), job);
  return std::shared_ptr<Rendezvous>(new Rendezvous(std::move(impl), host, port));
}

}  // namespace crosstrain::comm
