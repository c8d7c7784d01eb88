// Who may call the scheduler's API (service.h). Pure logic over libsodium: no sockets.
//
// People and tools hold bearer tokens (`Authorization: Bearer TOKEN`), each with a role: `read` sees jobs,
// clusters, metrics and reports; `admin` also submits and cancels. The tokens file has one "ROLE TOKEN" per line
// (# starts a comment), is private to its owner (mode 0600, as ssh requires of a key) and is compared in constant
// time; the daemon makes one with a fresh token of each role the first time it starts.
//
// Clusters prove who they are by signature instead: a registration or a link report carries
//   X-Crosstrain-Signature: CLUSTER UNIX_TIME NONCE HEX_ED25519_SIGNATURE
// over "crosstrain api v1" \n METHOD \n PATH \n UNIX_TIME \n NONCE \n hex SHA-256(BODY) (NONCE: 16 random hex digits, so
// that the same request sent twice in a second is two requests, not a replay), made with the cluster's own key
// (the ledger's, `crosstrain ledger keygen`) and checked against the public key the scheduler holds for that
// name. A signature is good for five minutes either side of the scheduler's clock and only once (a replay inside
// the window is refused), and it covers the method, the path and the whole body.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace crosstrain::scheduler {

enum class ApiRole { None = 0, Read = 1, Admin = 2 };
const char* to_string(ApiRole r);

class ApiTokens {
 public:
  // Throws UsageError naming the file and line: unreadable, readable by others, an unknown role, a token shorter
  // than 16 characters or with spaces, or no token at all.
  static ApiTokens load(const std::string& path);
  // Loads `path`, or first writes it (mode 0600) with a fresh random admin and read token when it does not exist.
  static ApiTokens load_or_create(const std::string& path);
  static ApiTokens parse(const std::string& text, const std::string& origin);

  void add(ApiRole role, const std::string& token);
  // The role of an Authorization header ("Bearer TOKEN"); None when it is missing, malformed or unknown.
  ApiRole role_of(const std::string& authorization) const;
  // The first token of `role` ("" when there is none): what the command line sends when given the file.
  std::string token(ApiRole role) const;
  bool empty() const { return tokens_.empty(); }

 private:
  std::vector<std::pair<ApiRole, std::string>> tokens_;
};

using ClusterKeys = std::map<std::string, std::array<unsigned char, 32>>;  // cluster name -> Ed25519 public key
constexpr const char* kSignatureHeader = "X-Crosstrain-Signature";

// The header value for a request signed by `cluster` with its 64-byte Ed25519 secret key (libsodium's layout).
std::string sign_request(const std::string& cluster, const unsigned char* secret_key, const std::string& method,
                         const std::string& path, const std::string& body, int64_t unix_time);

struct SignedBy {
  std::string cluster;  // set when the signature is good
  std::string error;    // why it is not, naming what to fix
};

// Checks signed requests against the clusters' public keys; remembers the signatures of the last ten minutes to
// refuse replays. Thread-safe.
class RequestVerifier {
 public:
  explicit RequestVerifier(ClusterKeys keys) : keys_(std::move(keys)) {}
  SignedBy verify(const std::string& header, const std::string& method, const std::string& path,
                  const std::string& body, int64_t now_unix);
  bool knows_clusters() const { return !keys_.empty(); }

 private:
  ClusterKeys keys_;
  std::mutex mutex_;
  std::map<std::string, int64_t> seen_;  // signature -> its time
};

}  // namespace crosstrain::scheduler
