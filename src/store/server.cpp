#include "crosstrain/store/server.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <system_error>

#include "crosstrain/core/launch_env.h"
#include "budget.h"
#include "crosstrain/store/socket.h"

namespace crosstrain::comm::store {

namespace {

// A message's buffer grows by this much as its bytes arrive: what a peer announces costs nothing by itself.
constexpr size_t kReceiveChunkBytes = 64 * 1024;
// How often a long wait looks whether its client is still there.
constexpr Millis kWaitSlice{250};

Message ok(std::vector<std::string> fields = {}) { return Message{Code::Ok, std::move(fields)}; }

// Whether the peer has hung up (or its connection failed), without consuming anything it sent.
bool peer_gone(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

// Reads a body of `size` bytes, growing the buffer (and the connection's share of the budget) chunk by chunk.
Io read_body(int fd, size_t size, const Patience& p, BudgetLease& lease, std::vector<uint8_t>& body) {
  body.clear();
  while (body.size() < size) {
    const size_t chunk = std::min(kReceiveChunkBytes, size - body.size());
    if (!lease.grow(chunk, p.at)) return Io::TimedOut;  // the budget stayed full until the message deadline
    const size_t at = body.size();
    body.resize(at + chunk);
    const Io io = read_exact(fd, body.data() + at, chunk, p);
    if (io != Io::Done) return io;
  }
  return Io::Done;
}

// One handshake frame (at most kMaxHelloBytes); nothing when the peer hangs up, stalls or sends garbage.
std::optional<Message> read_handshake_frame(int fd, const Patience& p) {
  uint8_t prefix[kLengthBytes];
  if (read_exact(fd, prefix, sizeof prefix, p) != Io::Done) return std::nullopt;
  try {
    const uint32_t size = parse_length(prefix, kMaxHelloBytes);
    std::vector<uint8_t> body(size);
    if (read_exact(fd, body.data(), size, p) != Io::Done) return std::nullopt;
    return decode_body(body.data(), size);
  } catch (const ProtocolError&) {
    return std::nullopt;
  }
}

// A stranger's job id goes into the log only when it is plain text: no escape sequences or forged lines.
std::string describe_job(const std::string& job) {
  if (job.empty()) return "no job id";
  return job_id_error(job).empty() ? "job id '" + job + "'" : "a malformed job id";
}

}  // namespace

StoreServer::StoreServer(ServerOptions options)
    : options_(std::move(options)), budget_(std::make_unique<ByteBudget>(options_.max_in_flight_bytes)) {
  port_ = options_.port;
  Listeners listeners = listen_on(options_.host, port_);
  listen_fds_ = std::move(listeners.fds);
  try {
    for (int fd : listen_fds_) bound_address_ += (bound_address_.empty() ? "" : ", ") + local_address(fd);
    loopback_only_ = store::loopback_only(listen_fds_);
    if (pipe2(wake_, O_CLOEXEC) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
    acceptor_ = start([this] { accept_loop(); });
  } catch (...) {
    close_descriptors();  // the destructor does not run for a constructor that throws
    throw;
  }
  if (!listeners.note.empty()) std::fprintf(stderr, "crosstrain: rendezvous store: %s\n", listeners.note.c_str());
}

StoreServer::~StoreServer() {
  stopping_ = true;
  (void)!write(wake_[1], "x", 1);
  acceptor_.join();
  table_->close();    // wakes connections blocked in a wait
  budget_->close();   // and those waiting for memory
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : connections_) shutdown(c->fd, SHUT_RDWR);  // wakes reads and writes
  }
  reap(true);
  close_descriptors();
}

void StoreServer::close_descriptors() {
  for (int fd : listen_fds_) close(fd);
  listen_fds_.clear();
  for (int& fd : wake_) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
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

size_t StoreServer::bytes_in_flight() const { return budget_->used(); }

std::thread StoreServer::start(std::function<void()> body) {
  return options_.start_thread ? options_.start_thread(std::move(body)) : std::thread(std::move(body));
}

void StoreServer::accept_loop() {
  std::vector<pollfd> fds;
  for (int fd : listen_fds_) fds.push_back({fd, POLLIN, 0});
  fds.push_back({wake_[0], POLLIN, 0});
  while (!stopping_) {
    for (auto& p : fds) p.revents = 0;
    poll(fds.data(), fds.size(), 1000);  // the timeout only paces the reaping of finished connections
    reap(false);
    for (size_t i = 0; i + 1 < fds.size() && !stopping_; ++i)
      if (fds[i].revents & POLLIN) accept_one(fds[i].fd);
  }
}

void StoreServer::accept_one(int listen_fd) {
  int fd = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno == EMFILE || errno == ENFILE) usleep(100 * 1000);  // out of descriptors: do not spin
    return;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  std::lock_guard<std::mutex> lock(mu_);
  size_t open = 0;
  Connection* oldest_pending = nullptr;  // connections_ is in order of arrival
  for (const auto& c : connections_) {
    if (c->done || c->displaced) continue;
    ++open;
    if (!oldest_pending && !c->admitted) oldest_pending = c.get();
  }
  if (open >= options_.max_connections) {
    if (!oldest_pending) {
      close(fd);
      return;
    }
    // Its thread's read fails at once and it goes; the newcomer gets the slot.
    oldest_pending->displaced = true;
    shutdown(oldest_pending->fd, SHUT_RDWR);
  }
  connections_.push_back(std::make_unique<Connection>());
  Connection& c = *connections_.back();
  c.fd = fd;
  try {
    c.thread = start([this, &c] {
      serve(c);
      shutdown(c.fd, SHUT_RDWR);  // the peer sees the hang-up now; the descriptor is closed when reaped
      release(c);
      c.done = true;
    });
  } catch (const std::exception& e) {
    // Out of threads (process or pids limit, a connection flood): turn this one away and keep serving; an
    // exception escaping here would terminate the launcher and every rank with it.
    connections_.pop_back();
    close(fd);
    if (!thread_failure_logged_.exchange(true))
      std::fprintf(stderr,
                   "crosstrain: warning: the rendezvous store at %s cannot start a thread for a new connection "
                   "(%s) and turns such connections away (ranks retry until their timeout); raise the process "
                   "limit (ulimit -u, or the container's pids limit) if ranks fail to join\n",
                   bound_address_.c_str(), e.what());
  }
}

void StoreServer::release(Connection& c) {
  std::lock_guard<std::mutex> guard(mu_);
  if (c.rank >= 0) ranks_.erase(c.rank);
  if (c.probe) --probes_;
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

bool StoreServer::send(Connection& c, const Message& message, Clock::time_point deadline) {
  std::vector<uint8_t> frame;
  try {
    frame = encode_frame(message);
  } catch (const ProtocolError& e) {
    frame = encode_frame(Message{Code::Invalid, {e.what()}});
  }
  try {
    if (c.session) frame = c.session->seal(frame);
  } catch (const ProtocolError&) {
    return false;  // a reply too large to seal: drop the connection (an exception here would end the process)
  }
  Patience p;
  p.at = deadline;                   // a client that reads its replies a byte at a time is dropped
  p.stall = options_.stall_timeout;  // and so is one that stops reading them
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
  std::vector<uint8_t> body(size);  // at most kMaxHelloBytes
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
    reason = job_mismatch(hello.job, options_.job.job_id);
    if (!reason.empty()) log_refusal(c, "it belongs to another job (" + describe_job(hello.job) + ")");
  }
  std::string server_nonce;
  if (reason.empty() && !options_.job.secret.empty()) {
    bool dropped = false;
    server_nonce = random_nonce();
    reason = authenticate(c, hello, server_nonce, p, dropped);
    if (dropped) return false;
  }
  if (reason.empty()) reason = admit_under_lock(c, hello);
  if (!reason.empty()) {
    send(c, Message{Code::Refused, {reason}}, p.at);
    return false;
  }
  Message welcome = ok({"world_size", std::to_string(options_.world_size), "version", std::to_string(kVersion)});
  if (!server_nonce.empty()) {
    // Only a client that proved the secret gets the store's own proof: strangers get nothing to guess against.
    welcome.fields.push_back("proof");
    welcome.fields.push_back(server_proof(options_.job.secret, hello.job, hello.nonce, server_nonce));
  }
  if (!send(c, welcome, p.at)) return false;
  if (!server_nonce.empty())
    c.session = std::make_unique<SessionSealer>(SessionSealer::Side::Server, options_.job.secret, hello.job,
                                                hello.rank, hello.world_size, hello.nonce, server_nonce);
  return true;
}

std::string StoreServer::authenticate(Connection& c, const Hello& hello, const std::string& server_nonce,
                                      const Patience& p, bool& dropped) {
  std::optional<Message> answer;
  if (send(c, Message{Code::Challenge, {server_nonce}}, p.at)) answer = read_handshake_frame(c.fd, p);
  if (!answer || answer->code != Code::Proof || answer->fields.size() != 1) {
    dropped = true;  // hung up, stalled or garbled: nothing it could read
    if (answer) log_refusal(c, "it did not answer the secret challenge");
    return "";
  }
  const ProofVerdict verdict = check_client_proof(options_.job.secret, hello.job, hello.rank, hello.world_size,
                                                  hello.nonce, server_nonce, answer->fields[0]);
  if (!verdict.admitted) log_refusal(c, verdict.log_why);
  return verdict.reason;
}

void StoreServer::log_refusal(const Connection& c, const std::string& why) {
  const std::string peer = peer_address(c.fd);
  std::optional<std::string> line;
  {
    std::lock_guard<std::mutex> lock(log_mu_);
    line = refusals_.line(peer, why, Clock::now());
  }
  if (line) std::fprintf(stderr, "%s\n", line->c_str());
}

std::string StoreServer::admit_under_lock(Connection& c, const Hello& hello) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string reason = admission_error(hello, options_.world_size, ranks_);
  if (!reason.empty()) return reason;
  if (hello.rank >= 0) {
    ranks_.insert(hello.rank);
    c.rank = hello.rank;
    c.max_frame = kMaxFrameBytes;
    return "";
  }
  // Ranks are bounded by the world size; tools and probes, which claim no rank, by their own count.
  if (probes_ >= options_.max_probes)
    return "this store already serves " + std::to_string(options_.max_probes) + " tool connections (rank -1); " +
           "close one, or wait until they finish";
  ++probes_;
  c.probe = true;
  c.max_frame = kMaxProbeFrameBytes;
  return "";
}

void StoreServer::serve(Connection& c) {
  if (!admit(c)) return;
  c.admitted = true;
  for (;;) {
    // Between messages a rank may stay silent for the whole job; within one it must keep sending, and finish.
    if (wait_readable(c.fd, Patience{}) != Io::Done || stopping_) return;
    Patience busy;
    busy.at = Clock::now() + options_.message_timeout;
    busy.stall = options_.stall_timeout;
    uint8_t prefix[kLengthBytes];
    if (read_exact(c.fd, prefix, sizeof prefix, busy) != Io::Done) return;
    BudgetLease lease(*budget_);  // held until the reply is sent: the request's fields live until then
    Message request;
    try {
      const uint32_t size = parse_length(prefix, c.max_frame + (c.session ? SessionSealer::kOverhead : 0));
      std::vector<uint8_t> body;
      if (read_body(c.fd, size, busy, lease, body) != Io::Done) return;
      if (c.session && !c.session->open(prefix, body)) {
        log_refusal(c, "a request of rank " + std::to_string(c.rank) +
                           " did not authenticate (changed, replayed or cut on the way?); connection closed");
        return;
      }
      request = decode_body(body.data(), body.size());
    } catch (const ProtocolError&) {
      return;  // the framing is lost: nothing after this can be trusted
    }
    std::optional<Message> reply = handle(c, request);
    if (!reply || !send(c, *reply, Clock::now() + options_.message_timeout)) return;
  }
}

std::optional<bool> StoreServer::wait_while_connected(Connection& c, int64_t wait_ms,
                                                      const std::function<bool(Clock::time_point)>& until) {
  // The job's timeout bounds every wait, whatever the client asked for; a client that hangs up mid-wait frees
  // its thread and slot within a slice instead of holding them to the end.
  const auto deadline = Clock::now() + std::min<Millis>(Millis(std::max<int64_t>(wait_ms, 0)), options_.max_wait);
  for (;;) {
    const auto slice_end = std::min(deadline, Clock::now() + kWaitSlice);
    if (until(slice_end)) return true;
    if (stopping_ || peer_gone(c.fd)) return std::nullopt;
    if (Clock::now() >= deadline) return false;
  }
}

std::optional<Message> StoreServer::handle(Connection& c, const Message& r) {
  std::string error = request_error(r);
  if (!error.empty()) return Message{Code::Invalid, {error}};
  const auto& f = r.fields;
  try {
    switch (r.code) {
      case Code::Set:
        table_->set(f[0], f[1]);
        return ok();
      case Code::Get: {
        std::optional<std::string> value;
        auto found = wait_while_connected(c, parse_int(f[1]), [&](Clock::time_point until) {
          value = table_->wait_get(f[0], until);
          return value.has_value();
        });
        if (!found) return std::nullopt;
        return *found ? ok({std::move(*value)}) : Message{Code::TimedOut, {}};
      }
      case Code::Add: return ok({std::to_string(table_->add(f[0], parse_int(f[1])))});
      case Code::CompareSet: return ok({table_->compare_set(f[0], f[1], f[2])});
      case Code::Delete: return ok({table_->erase(f[0]) ? "1" : "0"});
      case Code::Check: return ok({table_->contains_all(f) ? "1" : "0"});
      case Code::NumKeys: return ok({std::to_string(table_->size())});
      case Code::GetMany: {
        std::vector<std::string> keys(f.begin() + 1, f.end());
        std::optional<std::vector<std::string>> values;
        auto present = wait_while_connected(c, parse_int(f[0]), [&](Clock::time_point until) {
          values = table_->wait_get_all(keys, until);
          return values.has_value();
        });
        if (!present) return std::nullopt;
        if (!*present) return Message{Code::TimedOut, {}};
        size_t bytes = 0;
        for (const std::string& v : *values) bytes += v.size() + 4;
        // The reply must fit the frame a client reads: the values of many large keys are read one by one.
        if (bytes > kMaxValueBytes)
          return Message{Code::Invalid, {"the values of these " + std::to_string(keys.size()) + " keys hold " +
                                         std::to_string(bytes) + " bytes, more than one reply carries (" +
                                         std::to_string(kMaxValueBytes) + "): read them with get"}};
        return ok(std::move(*values));
      }
      case Code::Wait: {
        std::vector<std::string> keys(f.begin() + 1, f.end());
        auto present = wait_while_connected(c, parse_int(f[0]), [&](Clock::time_point until) {
          return table_->wait(keys, until);
        });
        if (!present) return std::nullopt;
        return *present ? ok() : Message{Code::TimedOut, {}};
      }
      default: break;
    }
  } catch (const std::exception& e) {
    return Message{Code::Invalid, {e.what()}};
  }
  return Message{Code::Invalid, {"unknown request"}};
}

}  // namespace crosstrain::comm::store
