#include "crosstrain/store/auth.h"

#include <sodium.h>
#include <sys/stat.h>

#include <array>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "crosstrain/core/error.h"
#include "crosstrain/store/protocol.h"

namespace crosstrain::comm::store {

namespace {

// libsodium picks its implementations and seeds nothing (randombytes uses getrandom); sodium_init is idempotent
// and thread-safe, so every entry point calls it.
void ensure_sodium() {
  static const bool ready = sodium_init() >= 0;
  if (!ready) throw std::runtime_error("libsodium could not be initialised");
}

// HMAC-SHA-256 over length-prefixed fields: "ab"+"c" and "a"+"bc" must not give the same proof.
class Hmac {
 public:
  explicit Hmac(const std::string& key) {
    ensure_sodium();
    crypto_auth_hmacsha256_init(&state_, reinterpret_cast<const unsigned char*>(key.data()), key.size());
  }
  Hmac& add(const std::string& field) {
    unsigned char length[4];
    for (int i = 0; i < 4; ++i) length[i] = static_cast<unsigned char>(field.size() >> (8 * i));
    crypto_auth_hmacsha256_update(&state_, length, sizeof length);
    crypto_auth_hmacsha256_update(&state_, reinterpret_cast<const unsigned char*>(field.data()), field.size());
    return *this;
  }
  std::string finish() {
    unsigned char out[crypto_auth_hmacsha256_BYTES];
    crypto_auth_hmacsha256_final(&state_, out);
    sodium_memzero(&state_, sizeof state_);
    return std::string(reinterpret_cast<const char*>(out), sizeof out);
  }

 private:
  crypto_auth_hmacsha256_state state_;
};

static_assert(kProofBytes == crypto_auth_hmacsha256_BYTES, "a proof is one HMAC-SHA-256");

std::string trim(const std::string& text) {
  const char* space = " \t\r\n";
  const size_t first = text.find_first_not_of(space);
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(space) - first + 1);
}

}  // namespace

std::string random_nonce() {
  ensure_sodium();
  std::string nonce(kNonceBytes, '\0');
  randombytes_buf(nonce.data(), nonce.size());
  return nonce;
}

std::string new_job_id() {
  ensure_sodium();
  unsigned char raw[8];
  randombytes_buf(raw, sizeof raw);
  char hex[2 * sizeof raw + 1];
  sodium_bin2hex(hex, sizeof hex, raw, sizeof raw);
  return hex;
}

std::string server_proof(const std::string& secret, const std::string& job, const std::string& client_nonce,
                         const std::string& server_nonce) {
  return Hmac(secret).add("crosstrain store: server").add(job).add(client_nonce).add(server_nonce).finish();
}

std::string client_proof(const std::string& secret, const std::string& job, int rank, int world_size,
                         const std::string& client_nonce, const std::string& server_nonce) {
  return Hmac(secret)
      .add("crosstrain store: client")
      .add(job)
      .add(std::to_string(rank))
      .add(std::to_string(world_size))
      .add(client_nonce)
      .add(server_nonce)
      .finish();
}

SessionSealer::SessionSealer(Side side, const std::string& secret, const std::string& job, int rank, int world_size,
                             const std::string& client_nonce, const std::string& server_nonce) {
  const std::string session = Hmac(secret)
                                  .add("crosstrain store: session")
                                  .add(job)
                                  .add(std::to_string(rank))
                                  .add(std::to_string(world_size))
                                  .add(client_nonce)
                                  .add(server_nonce)
                                  .finish();
  static_assert(crypto_auth_hmacsha256_BYTES == crypto_aead_chacha20poly1305_IETF_KEYBYTES);
  static_assert(kOverhead == crypto_aead_chacha20poly1305_IETF_ABYTES);
  const std::string to_server = Hmac(session).add("client to server").finish();
  const std::string to_client = Hmac(session).add("server to client").finish();
  send_key_ = side == Side::Client ? to_server : to_client;
  recv_key_ = side == Side::Client ? to_client : to_server;
}

SessionSealer::~SessionSealer() {
  sodium_memzero(send_key_.data(), send_key_.size());
  sodium_memzero(recv_key_.data(), recv_key_.size());
}

namespace {

std::array<unsigned char, crypto_aead_chacha20poly1305_IETF_NPUBBYTES> frame_nonce(uint64_t number) {
  std::array<unsigned char, crypto_aead_chacha20poly1305_IETF_NPUBBYTES> n{};
  for (int i = 0; i < 8; ++i) n[4 + i] = static_cast<unsigned char>(number >> (8 * i));
  return n;
}

}  // namespace

std::vector<uint8_t> SessionSealer::seal(const std::vector<uint8_t>& frame) {
  if (frame.size() < kLengthBytes) throw std::logic_error("SessionSealer::seal: not a frame");
  const size_t body = frame.size() - kLengthBytes;
  const uint64_t sealed = body + kOverhead;
  if (sealed > 0xffffffffULL) throw ProtocolError("a sealed frame would exceed 4 GiB");
  std::vector<uint8_t> out(kLengthBytes + sealed);
  for (size_t i = 0; i < kLengthBytes; ++i) out[i] = static_cast<uint8_t>(sealed >> (8 * i));
  const auto nonce = frame_nonce(sent_++);
  crypto_aead_chacha20poly1305_ietf_encrypt_detached(
      out.data() + kLengthBytes, out.data() + kLengthBytes + body, nullptr, frame.data() + kLengthBytes, body,
      out.data(), kLengthBytes, nullptr, nonce.data(), reinterpret_cast<const unsigned char*>(send_key_.data()));
  return out;
}

bool SessionSealer::open(const uint8_t* prefix, std::vector<uint8_t>& body) {
  if (body.size() < kOverhead) return false;
  const size_t plain = body.size() - kOverhead;
  const auto nonce = frame_nonce(received_);
  const int rc = crypto_aead_chacha20poly1305_ietf_decrypt_detached(
      body.data(), nullptr, body.data(), plain, body.data() + plain, prefix, kLengthBytes, nonce.data(),
      reinterpret_cast<const unsigned char*>(recv_key_.data()));
  if (rc != 0) return false;
  ++received_;
  body.resize(plain);
  return true;
}

bool proof_matches(const std::string& expected, const std::string& got) {
  ensure_sodium();
  return expected.size() == got.size() && !expected.empty() &&
         sodium_memcmp(expected.data(), got.data(), expected.size()) == 0;
}

std::string job_mismatch(const std::string& client_job, const std::string& store_job) {
  if (client_job == store_job) return "";
  auto name = [](const std::string& job) { return job.empty() ? std::string("no job id") : "job id '" + job + "'"; };
  return "this store belongs to a job with " + name(store_job) + ", but this process was started with " +
         name(client_job) + " (CROSSTRAIN_JOB_ID): another job is using this port";
}

ProofVerdict check_client_proof(const std::string& secret, const std::string& job, int rank, int world_size,
                                const std::string& client_nonce, const std::string& server_nonce,
                                const std::string& proof) {
  ProofVerdict v;
  if (proof.empty()) {
    v.reason = "this job has a secret and this process has none; set CROSSTRAIN_SECRET to the job's secret";
    v.log_why = "it has no job secret";
    return v;
  }
  const std::string expected = client_proof(secret, job, rank, world_size, client_nonce, server_nonce);
  if (client_nonce.size() != kNonceBytes || !proof_matches(expected, proof)) {
    v.reason = "wrong job secret; set CROSSTRAIN_SECRET to the job's secret";
    v.log_why = "it did not prove the job secret";
    return v;
  }
  v.admitted = true;
  return v;
}

std::string check_server_proof(const std::string& secret, const std::string& job, const std::string& client_nonce,
                               const std::string& server_nonce, const std::string& proof) {
  if (secret.empty())
    return "it requires the job secret and this process has none; set CROSSTRAIN_SECRET to the job's secret";
  if (server_nonce.size() != kNonceBytes || !proof_matches(server_proof(secret, job, client_nonce, server_nonce), proof))
    return "it did not prove the job secret (a store of another job, or not the job's own); check that "
           "CROSSTRAIN_SECRET is the same for the launcher and every rank";
  return "";
}

std::optional<std::string> RefusalLog::line(const std::string& peer, const std::string& why, Clock::time_point now) {
  if (in_window_ == 0 || now - window_start_ >= window_) {
    window_start_ = now;
    in_window_ = 0;
  }
  if (in_window_ >= burst_) {
    ++left_out_;
    return std::nullopt;
  }
  ++in_window_;
  std::string text = "crosstrain: refused a store connection from " + peer + ": " + why;
  if (left_out_ > 0) {
    text += " (" + std::to_string(left_out_) + " more refused connection" + (left_out_ == 1 ? "" : "s") +
            " not shown)";
    left_out_ = 0;
  }
  return text;
}

std::string read_secret_file(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0)
    throw UsageError("run.secret_file '" + path + "' cannot be read: " + std::strerror(errno));
  if ((st.st_mode & 0077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw UsageError("run.secret_file '" + path + "' is accessible by others (mode " + mode +
                     "); a job secret must be private to its owner, as ssh requires of a private key: chmod 600 " +
                     path);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) throw UsageError("run.secret_file '" + path + "' cannot be read: " + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  std::string secret = trim(text.str());
  if (secret.empty()) throw UsageError("run.secret_file '" + path + "' is empty; put the job's secret in it");
  return secret;
}

std::string open_store_warning(const std::string& who, const std::string& address) {
  return who + ": warning: the rendezvous store listens on " + address +
         " without a job secret; anyone who reaches the port can join. Set CROSSTRAIN_SECRET (the same value for "
         "every launcher) or run.secret_file to refuse peers that do not know it";
}

}  // namespace crosstrain::comm::store
