#include "crosstrain/store/client.h"

#include <unistd.h>

#include <algorithm>
#include <optional>
#include <thread>

#include "crosstrain/store/auth.h"
#include "common.h"
#include "crosstrain/store/socket.h"

namespace crosstrain::comm::store {

namespace {

// Time for a reply to travel once the server has finished waiting.
constexpr Millis kReplyMargin{1000};

const char* io_problem(Io io) {
  switch (io) {
    case Io::Closed: return "the store closed the connection";
    case Io::TimedOut: return "no reply within the timeout";
    default: return "the connection failed";
  }
}

}  // namespace

StoreClient::StoreClient(std::string host, int port, Hello hello, Millis timeout, std::string secret)
    : c10d::Store(timeout), address_(endpoint(host, port)), hello_(std::move(hello)), secret_(std::move(secret)) {
  try {
    connect_and_greet(host, port);
  } catch (...) {
    if (fd_ >= 0) close(fd_);  // the destructor does not run for a constructor that throws
    throw;
  }
}

StoreClient::~StoreClient() {
  if (fd_ >= 0) close(fd_);
}

void StoreClient::fail(const std::string& what, const std::string& cause, bool timed_out) const {
  fail_store_op(hello_.rank, timeout_, what, address_, cause, timed_out);
}

Millis StoreClient::effective(Millis timeout) const { return timeout == kNoTimeout ? timeout_ : timeout; }

void StoreClient::connect_and_greet(const std::string& host, int port) {
  const auto deadline = Clock::now() + timeout_;
  // Under mpirun/srun rank 0 may not be listening yet, and a store at its connection limit hangs up at once:
  // retry, backing off, until the timeout.
  for (Millis pause{50};; pause = std::min(pause * 2, Millis(1000))) {
    const std::string problem = greet(host, port, deadline);
    if (problem.empty()) return;
    const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
    if (left <= Millis(0)) fail("connect", problem, true);
    std::this_thread::sleep_for(std::min(pause, left));
  }
}

std::string StoreClient::greet(const std::string& host, int port, Clock::time_point deadline) {
  std::string error;
  fd_ = connect_to(host, port, deadline, error);
  if (fd_ < 0)
    return "cannot reach it (" + error + "); check MASTER_ADDR/MASTER_PORT and that rank 0 or the launcher of " +
           "node 0 is running";
  Patience p;
  p.at = deadline;
  hello_.nonce = secret_.empty() ? "" : random_nonce();  // fresh for every attempt: a proof answers one pair
  session_.reset();
  std::vector<uint8_t> out = encode_preamble();
  std::vector<uint8_t> frame = encode_frame(encode_hello(hello_));
  out.insert(out.end(), frame.begin(), frame.end());
  Io io = write_all(fd_, out.data(), out.size(), p);
  std::optional<Message> reply;
  if (io == Io::Done) reply = read_handshake_reply(p, io);
  const std::string not_ours = " during the handshake (is that address a crosstrain rendezvous store of the same "
                               "version, and not another program?)";
  if (io == Io::TimedOut) fail("handshake", "no reply within the timeout" + not_ours, true);
  if (!reply) {
    close(fd_);
    fd_ = -1;
    return std::string(io_problem(io)) + not_ours;
  }
  std::string server_nonce;
  if (reply->code == Code::Challenge) {
    if (reply->fields.size() != 1) fail("handshake", "a malformed secret challenge");
    server_nonce = reply->fields[0];
    reply = answer_challenge(server_nonce, p);
  }
  if (reply->code == Code::Refused)
    fail("joining", "refused this process: " + (reply->fields.empty() ? std::string("no reason given") : reply->fields[0]));
  if (reply->code != Code::Ok) fail("handshake", "unexpected reply");
  if (!secret_.empty()) {
    check_store_proof(*reply, server_nonce);
    session_ = std::make_unique<SessionSealer>(SessionSealer::Side::Client, secret_, hello_.job, hello_.rank,
                                               hello_.world_size, hello_.nonce, server_nonce);
  }
  return "";
}

void StoreClient::check_store_proof(const Message& welcome, const std::string& server_nonce) {
  if (server_nonce.empty())
    fail("joining", "it runs without a job secret, but this process has one (CROSSTRAIN_SECRET or "
                    "run.secret_file): give the launcher of node 0 (or rank 0) the same secret");
  std::string proof;
  for (size_t i = 0; i + 1 < welcome.fields.size(); i += 2)
    if (welcome.fields[i] == "proof") proof = welcome.fields[i + 1];
  const std::string problem = check_server_proof(secret_, hello_.job, hello_.nonce, server_nonce, proof);
  if (!problem.empty()) fail("joining", problem);
}

std::optional<Message> StoreClient::read_handshake_reply(const Patience& p, Io& io) {
  uint8_t prefix[kLengthBytes];
  io = read_exact(fd_, prefix, sizeof prefix, p);
  if (io != Io::Done) return std::nullopt;
  try {
    const uint32_t size = parse_length(prefix, kMaxFrameBytes);
    std::vector<uint8_t> body(size);
    io = read_exact(fd_, body.data(), size, p);
    if (io != Io::Done) fail("handshake", io_problem(io), io == Io::TimedOut);
    return decode_body(body.data(), size);
  } catch (const ProtocolError& e) {
    fail("handshake", std::string("unreadable reply (") + e.what() + "): is that address a crosstrain store?");
  }
}

Message StoreClient::answer_challenge(const std::string& server_nonce, const Patience& p) {
  // Empty without a secret: the store then says why it refuses this process.
  const std::string proof =
      secret_.empty() ? "" : client_proof(secret_, hello_.job, hello_.rank, hello_.world_size, hello_.nonce, server_nonce);
  const std::vector<uint8_t> frame = encode_frame(Message{Code::Proof, {proof}});
  Io io = write_all(fd_, frame.data(), frame.size(), p);
  std::optional<Message> reply;
  if (io == Io::Done) reply = read_handshake_reply(p, io);
  if (!reply) fail("handshake", std::string(io_problem(io)) + " after the secret challenge", io == Io::TimedOut);
  return *reply;
}

Message StoreClient::call(const std::string& what, const Message& request, Millis reply_within) {
  std::lock_guard<std::mutex> lock(mu_);
  if (fd_ < 0) fail(what, "the connection was closed after an earlier failure");
  std::vector<uint8_t> frame;
  try {
    frame = encode_frame(request);
    if (session_) frame = session_->seal(frame);
  } catch (const ProtocolError& e) {
    fail(what, e.what());
  }
  Patience p;
  p.at = Clock::now() + reply_within;
  Io io = write_all(fd_, frame.data(), frame.size(), p);
  uint8_t prefix[kLengthBytes];
  if (io == Io::Done) io = read_exact(fd_, prefix, sizeof prefix, p);
  Message reply;
  std::string problem;
  if (io == Io::Done) {
    try {
      const uint32_t size = parse_length(prefix, kMaxFrameBytes + (session_ ? SessionSealer::kOverhead : 0));
      std::vector<uint8_t> body(size);
      io = read_exact(fd_, body.data(), size, p);
      if (io == Io::Done && session_ && !session_->open(prefix, body))
        problem = "a reply from the store did not authenticate: it was changed, replayed or cut on the way "
                  "(someone in the path between this process and the store?); the connection is closed";
      else if (io == Io::Done)
        reply = decode_body(body.data(), body.size());
    } catch (const ProtocolError& e) {
      problem = std::string("unreadable reply: ") + e.what();
    }
  }
  if (io != Io::Done || !problem.empty()) {
    close(fd_);  // a late reply would answer the next request
    fd_ = -1;
    fail(what, problem.empty() ? io_problem(io) : problem, io == Io::TimedOut);
  }
  if (reply.code == Code::Invalid)
    fail(what, "rejected: " + (reply.fields.empty() ? std::string("no reason given") : reply.fields[0]));
  if (reply.code != Code::Ok && reply.code != Code::TimedOut) fail(what, "unexpected reply");
  return reply;
}

void StoreClient::set(const std::string& key, const std::vector<uint8_t>& value) {
  call("set of key '" + key + "'", Message{Code::Set, {key, text(value)}}, timeout_);
}

std::vector<uint8_t> StoreClient::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                             const std::vector<uint8_t>& desired) {
  auto reply = call("compareSet of key '" + key + "'", Message{Code::CompareSet, {key, text(expected), text(desired)}},
                    timeout_);
  return bytes(reply.fields.at(0));
}

std::vector<uint8_t> StoreClient::get(const std::string& key) {
  const std::string what = "get of key '" + key + "'";
  auto reply = call(what, Message{Code::Get, {key, std::to_string(timeout_.count())}}, timeout_ + kReplyMargin);
  if (reply.code == Code::TimedOut) fail(what, "the key was not set in time (has every rank started?)", true);
  return bytes(reply.fields.at(0));
}

int64_t StoreClient::add(const std::string& key, int64_t value) {
  auto reply = call("add to key '" + key + "'", Message{Code::Add, {key, std::to_string(value)}}, timeout_);
  return parse_int(reply.fields.at(0));
}

bool StoreClient::deleteKey(const std::string& key) {
  return call("delete of key '" + key + "'", Message{Code::Delete, {key}}, timeout_).fields.at(0) == "1";
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  return call("check of " + describe_keys(keys), Message{Code::Check, keys}, timeout_).fields.at(0) == "1";
}

int64_t StoreClient::getNumKeys() { return parse_int(call("key count", Message{Code::NumKeys, {}}, timeout_).fields.at(0)); }

void StoreClient::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

std::vector<std::vector<uint8_t>> StoreClient::get_many(const std::vector<std::string>& keys, Millis wait) {
  const Millis t = effective(wait);
  const std::string what = "get of " + describe_keys(keys);
  Message request{Code::GetMany, {std::to_string(t.count())}};
  request.fields.insert(request.fields.end(), keys.begin(), keys.end());
  const Message reply = call(what, request, t + kReplyMargin);
  if (reply.code == Code::TimedOut)
    fail(what, "not all set within " + std::to_string(t.count()) + " ms (has every rank started?)", true);
  if (reply.fields.size() != keys.size())
    fail(what, "the store answered " + std::to_string(reply.fields.size()) + " values for " +
                   std::to_string(keys.size()) + " keys");
  std::vector<std::vector<uint8_t>> values;
  values.reserve(keys.size());
  for (const std::string& v : reply.fields) values.push_back(bytes(v));
  return values;
}

void StoreClient::wait(const std::vector<std::string>& keys, const Millis& timeout) {
  const Millis t = effective(timeout);
  const std::string what = "wait for " + describe_keys(keys);
  Message request{Code::Wait, {std::to_string(t.count())}};
  request.fields.insert(request.fields.end(), keys.begin(), keys.end());
  if (call(what, request, t + kReplyMargin).code == Code::TimedOut)
    fail(what, "not set within " + std::to_string(t.count()) + " ms (has every rank started?)", true);
}

}  // namespace crosstrain::comm::store
