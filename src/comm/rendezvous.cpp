#include "crosstrain/comm/rendezvous.h"

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

namespace crosstrain::comm {

struct Rendezvous::Impl {
  c10::intrusive_ptr<c10d::Store> store;
};

namespace {

std::string endpoint(const std::string& host, int port) {
  return (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string first_line(const std::string& text) {
  auto end = text.find('\n');
  return end == std::string::npos ? text : text.substr(0, end);
}

}  // namespace

Rendezvous::Rendezvous(std::unique_ptr<Impl> impl, std::string address, int port)
    : impl_(std::move(impl)), address_(std::move(address)), port_(port) {}

Rendezvous::~Rendezvous() = default;

c10::intrusive_ptr<c10d::Store> Rendezvous::store() const { return impl_->store; }

std::shared_ptr<Rendezvous> Rendezvous::host(const std::string& host, int port, int world_size, Millis timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = true;
  options.numWorkers = c10::nullopt;
  options.waitWorkers = false;
  options.timeout = timeout;
  auto impl = std::make_unique<Impl>();
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(host, options);
    int bound = store->getPort();
    impl->store = store;
    return std::shared_ptr<Rendezvous>(new Rendezvous(std::move(impl), host, bound));
  } catch (const std::exception& e) {
    CommContext c;
    c.op = "rendezvous";
    std::string what = e.what();
    std::string hint = what.find("in use") != std::string::npos || what.find("EADDRINUSE") != std::string::npos
                           ? "port " + std::to_string(port) + " is already in use; choose another with " +
                                 "--master HOST:PORT (or MASTER_PORT), or stop the process holding it"
                           : "cannot host the rendezvous store on " + endpoint(host, port) + ": " + first_line(what);
    throw CommError(c, hint);
  }
}

std::shared_ptr<Rendezvous> Rendezvous::connect(const std::string& host, int port, int rank, Millis timeout) {
  c10d::TCPStoreOptions options;
  options.port = static_cast<uint16_t>(port);
  options.isServer = false;
  options.waitWorkers = false;
  options.timeout = timeout;
  auto impl = std::make_unique<Impl>();
  try {
    impl->store = c10::make_intrusive<c10d::TCPStore>(host, options);
  } catch (const std::exception& e) {
    CommContext c;
    c.rank = rank;
    c.op = "rendezvous";
    c.timeout = timeout;
    throw CommError(c,
                    "cannot reach the rendezvous store at " + endpoint(host, port) + " (" + first_line(e.what()) +
                        "); check MASTER_ADDR/MASTER_PORT and that rank 0 or the launcher of node 0 is running",
                    true);
  }
  return std::shared_ptr<Rendezvous>(new Rendezvous(std::move(impl), host, port));
}

}  // namespace crosstrain::comm
