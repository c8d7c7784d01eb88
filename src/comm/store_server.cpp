#include "crosstrain/comm/store_server.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <system_error>

#include "store_socket.h"

namespace crosstrain::comm::store {

namespace {

Clock::time_point after(int64_t ms) {
  // A day at most: the client's own timeout is what really bounds a wait.
  return Clock::now() + Millis(std::clamp<int64_t>(ms, 0, 24 * 3600 * 1000));
}

Message ok(std::vector<std::string> fields = {}) { return Message{Code::Ok, std::move(fields)}; }

}  // namespace

StoreServer::StoreServer(ServerOptions options) : options_(std::move(options)) {
  port_ = options_.port;
  listen_fd_ = listen_on(options_.host, port_);
  bound_address_ = local_address(listen_fd_);
  if (pipe2(wake_, O_CLOEXEC) != 0) {
    close(listen_fd_);
    throw std::system_error(errno, std::generic_category(), "pipe");
  }
  acceptor_ = std::thread([this] { accept_loop(); });
}

StoreServer::~StoreServer() {
  stopping_ = true;
  (void)!write(wake_[1], "x", 1);
  acceptor_.join();
  table_->close();  // wakes connections blocked in a wait
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : connections_) shutdown(c->fd, SHUT_RDWR);  // wakes reads and writes
  }
  reap(true);
  close(listen_fd_);
  close(wake_[0]);
  close(wake_[1]);
}

void StoreServer::claim_rank(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  ranks_.insert(rank);
}

size_t StoreServer::connections() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t open = 0;
  for (const auto& c : connections_) open += c->done ? 0 : 1;
  return open;
}

void StoreServer::accept_loop() {
  while (!stopping_) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    poll(fds, 2, 1000);  // the timeout only paces the reaping of finished connections
    reap(false);
    if (stopping_ || !(fds[0].revents & POLLIN)) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) usleep(100 * 1000);  // out of descriptors: do not spin
      continue;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::lock_guard<std::mutex> lock(mu_);
    if (connections_.size() >= options_.max_connections) {
      close(fd);
      continue;
    }
    connections_.push_back(std::make_unique<Connection>());
    Connection& c = *connections_.back();
    c.fd = fd;
    c.thread = std::thread([this, &c] {
      serve(c);
      shutdown(c.fd, SHUT_RDWR);  // the peer sees the hang-up now; the descriptor is closed when reaped
      if (c.rank >= 0) {
        std::lock_guard<std::mutex> guard(mu_);
        ranks_.erase(c.rank);
      }
      c.done = true;
    });
  }
}

void StoreServer::reap(bool all) {
  std::vector<std::unique_ptr<Connection>> finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = connections_.begin(); it != connections_.end();) {
      if (all || (*it)->done) {
        finished.push_back(std::move(*it));
        it = connections_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // Joined outside the lock: a finishing thread takes it to release its rank.
  for (auto& c : finished) {
    if (c->thread.joinable()) c->thread.join();
    close(c->fd);
  }
}

bool StoreServer::send(Connection& c, const Message& message) {
  std::vector<uint8_t> frame;
  try {
    frame = encode_frame(message);
  } catch (const ProtocolError& e) {
    frame = encode_frame(Message{Code::Invalid, {e.what()}});
  }
  Patience p;
  p.stall = options_.stall_timeout;  // a client that stops reading its replies is dropped too
  return write_all(c.fd, frame.data(), frame.size(), p) == Io::Done;
}

bool StoreServer::admit(Connection& c) {
  Patience p;
  p.at = Clock::now() + options_.handshake_timeout;
  uint8_t preamble[kPreambleBytes];
  uint8_t prefix[kLengthBytes];
  uint32_t version = 0, size = 0;
  try {
    if (read_exact(c.fd, preamble, sizeof preamble, p) != Io::Done) return false;
    version = parse_preamble(preamble);
    if (read_exact(c.fd, prefix, sizeof prefix, p) != Io::Done) return false;
    size = parse_length(prefix, kMaxHelloBytes);
  } catch (const ProtocolError&) {
    return false;  // not one of ours, or oversized: nothing it could read, so just hang up
  }
  std::vector<uint8_t> body(size);
  if (read_exact(c.fd, body.data(), size, p) != Io::Done) return false;
  std::string reason;
  Hello hello;
  try {
    hello = decode_hello(decode_body(body.data(), size));
  } catch (const ProtocolError& e) {
    reason = e.what();
  }
  if (reason.empty() && version != kVersion)
    reason = "this store speaks protocol version " + std::to_string(kVersion) + ", the client version " +
             std::to_string(version) + ": run the same crosstrain on every node";
  if (reason.empty()) {
    std::lock_guard<std::mutex> lock(mu_);
    reason = admission_error(hello, options_.world_size, ranks_);
    if (reason.empty() && hello.rank >= 0) {
      ranks_.insert(hello.rank);
      c.rank = hello.rank;
    }
  }
  if (!reason.empty()) {
    send(c, Message{Code::Refused, {reason}});
    return false;
  }
  return send(c, ok({"world_size", std::to_string(options_.world_size), "version", std::to_string(kVersion)}));
}

void StoreServer::serve(Connection& c) {
  if (!admit(c)) return;
  Patience busy;
  busy.stall = options_.stall_timeout;
  for (;;) {
    // Between messages a rank may stay silent for the whole job; within one it must keep sending.
    if (wait_readable(c.fd, Patience{}) != Io::Done || stopping_) return;
    uint8_t prefix[kLengthBytes];
    if (read_exact(c.fd, prefix, sizeof prefix, busy) != Io::Done) return;
    Message request;
    try {
      const uint32_t size = parse_length(prefix, kMaxFrameBytes);
      std::vector<uint8_t> body(size);
      if (read_exact(c.fd, body.data(), size, busy) != Io::Done) return;
      request = decode_body(body.data(), size);
    } catch (const ProtocolError&) {
      return;  // the framing is lost: nothing after this can be trusted
    }
    if (!send(c, handle(request))) return;
  }
}

Message StoreServer::handle(const Message& r) {
  std::string error = request_error(r);
  if (!error.empty()) return Message{Code::Invalid, {error}};
  const auto& f = r.fields;
  try {
    switch (r.code) {
      case Code::Set:
        table_->set(f[0], f[1]);
        return ok();
      case Code::Get: {
        auto value = table_->wait_get(f[0], after(parse_int(f[1])));
        return value ? ok({std::move(*value)}) : Message{Code::TimedOut, {}};
      }
      case Code::Add: return ok({std::to_string(table_->add(f[0], parse_int(f[1])))});
      case Code::CompareSet: return ok({table_->compare_set(f[0], f[1], f[2])});
      case Code::Delete: return ok({table_->erase(f[0]) ? "1" : "0"});
      case Code::Check: return ok({table_->contains_all(f) ? "1" : "0"});
      case Code::NumKeys: return ok({std::to_string(table_->size())});
      case Code::Wait: {
        std::vector<std::string> keys(f.begin() + 1, f.end());
        return table_->wait(keys, after(parse_int(f[0]))) ? ok() : Message{Code::TimedOut, {}};
      }
      default: break;
    }
  } catch (const std::exception& e) {
    return Message{Code::Invalid, {e.what()}};
  }
  return Message{Code::Invalid, {"unknown request"}};
}

}  // namespace crosstrain::comm::store
