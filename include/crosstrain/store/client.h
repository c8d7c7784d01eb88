// A c10d::Store that talks to crosstrain's rendezvous store server (store_server.h), so ProcessGroupGloo and
// PrefixStore work on it unchanged.
//
// Nothing waits forever: connecting (with retries while nothing listens yet) and the handshake share one
// `timeout`; every request waits at most the store's timeout (a wait: its own timeout, plus one second for the
// reply to travel); c10d's kNoTimeout means the store's timeout here. After a timed-out request the connection
// is closed, since a late reply would be read as the answer to the next request. Errors are CommErrors that
// name the store's address, the rank and the operation.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "crosstrain/store/auth.h"
#include "crosstrain/store/protocol.h"
#include "crosstrain/store/reads_many_keys.h"

namespace crosstrain::comm::store {

struct Patience;  // store_socket.h
enum class Io;

class StoreClient : public c10d::Store, public ReadsManyKeys {
 public:
  // Throws CommError when the store cannot be reached in time or refuses this rank (another job on the port,
  // a different world size, a rank already present, a wrong or missing job secret), or when `secret` is set and
  // the store does not prove it knows it; the message says which. `hello.job` names the job.
  StoreClient(std::string host, int port, Hello hello, std::chrono::milliseconds timeout, std::string secret = "");
  ~StoreClient() override;

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  std::vector<std::vector<uint8_t>> get_many(const std::vector<std::string>& keys, std::chrono::milliseconds wait) override;

  const std::string& address() const { return address_; }

 private:
  void connect_and_greet(const std::string& host, int port);
  // One attempt: "" once admitted, else why it should be retried; throws CommError when retrying cannot help.
  std::string greet(const std::string& host, int port, std::chrono::steady_clock::time_point deadline);
  // The server's next handshake frame; nothing (with `io` set) when the connection ended before its prefix.
  std::optional<Message> read_handshake_reply(const Patience& p, Io& io);
  // Answers the store's challenge with this process's proof (or an empty one) and returns its verdict frame.
  Message answer_challenge(const std::string& server_nonce, const Patience& p);
  // Throws unless the store's welcome carries its proof of the secret over this connection's nonces.
  void check_store_proof(const Message& welcome, const std::string& server_nonce);
  // Sends `request` and returns the reply (Ok or TimedOut); throws CommError on anything else.
  Message call(const std::string& what, const Message& request, std::chrono::milliseconds reply_within);
  [[noreturn]] void fail(const std::string& what, const std::string& cause, bool timed_out = false) const;
  std::chrono::milliseconds effective(std::chrono::milliseconds timeout) const;

  std::string address_;
  Hello hello_;
  std::string secret_;  // never sent: only proofs over fresh nonces are
  int fd_ = -1;
  std::unique_ptr<SessionSealer> session_;  // with a secret: seals every frame after the handshake
  std::mutex mu_;  // one request at a time on the connection
};

}  // namespace crosstrain::comm::store
