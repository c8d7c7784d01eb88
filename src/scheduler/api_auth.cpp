#include "crosstrain/scheduler/api_auth.h"

#include <sodium.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "crosstrain/core/error.h"

namespace crosstrain::scheduler {
namespace {

constexpr int64_t kSkewSeconds = 300;
constexpr size_t kMinTokenChars = 16;

void ensure_sodium() {
  static const bool ready = sodium_init() >= 0;
  if (!ready) throw Error("libsodium failed to initialise (sodium_init)");
}

std::string hex(const unsigned char* data, size_t n) {
  std::string out(2 * n + 1, '\0');
  sodium_bin2hex(out.data(), out.size(), data, n);
  out.pop_back();
  return out;
}

std::string random_token() {
  ensure_sodium();
  unsigned char raw[24];
  randombytes_buf(raw, sizeof raw);
  return hex(raw, sizeof raw);
}

std::string signed_text(const std::string& method, const std::string& path, int64_t time, const std::string& nonce,
                        const std::string& body) {
  unsigned char digest[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(digest, reinterpret_cast<const unsigned char*>(body.data()), body.size());
  return "crosstrain api v1\n" + method + "\n" + path + "\n" + std::to_string(time) + "\n" + nonce + "\n" +
         hex(digest, sizeof digest);
}

}  // namespace

const char* to_string(ApiRole r) {
  switch (r) {
    case ApiRole::Admin: return "admin";
    case ApiRole::Read: return "read";
    case ApiRole::None: return "none";
  }
  return "?";
}

ApiTokens ApiTokens::parse(const std::string& text, const std::string& origin) {
  ApiTokens t;
  std::istringstream in(text);
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const size_t hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string role, token, extra;
    if (!(words >> role)) continue;
    const std::string where = origin + " line " + std::to_string(number);
    if (!(words >> token) || (words >> extra))
      throw UsageError(where + ": write one role and one token (\"admin TOKEN\" or \"read TOKEN\")");
    if (role != "admin" && role != "read") throw UsageError(where + ": role '" + role + "' is not admin or read");
    if (token.size() < kMinTokenChars)
      throw UsageError(where + ": a token needs at least " + std::to_string(kMinTokenChars) +
                       " characters (`openssl rand -hex 24` makes one)");
    t.add(role == "admin" ? ApiRole::Admin : ApiRole::Read, token);
  }
  if (t.empty()) throw UsageError(origin + " holds no token; add a line \"admin TOKEN\"");
  return t;
}

ApiTokens ApiTokens::load(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0)
    throw UsageError("scheduler tokens file '" + path + "' cannot be read: " + std::strerror(errno));
  if ((st.st_mode & 0077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw UsageError("scheduler tokens file '" + path + "' is accessible by others (mode " + mode +
                     "); tokens must be private to their owner: chmod 600 " + path);
  }
  std::ifstream in(path);
  if (!in) throw UsageError("scheduler tokens file '" + path + "' cannot be read: " + std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  return parse(text.str(), "scheduler tokens file '" + path + "'");
}

ApiTokens ApiTokens::load_or_create(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) == 0) return load(path);
  const std::string text = "# crosstrain scheduler API tokens: ROLE TOKEN (admin submits and cancels; read sees)\n"
                           "admin " + random_token() + "\nread " + random_token() + "\n";
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wx");
  if (!f) throw UsageError("cannot create the scheduler tokens file '" + tmp + "': " + std::strerror(errno));
  chmod(tmp.c_str(), 0600);
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !written || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw UsageError("cannot write the scheduler tokens file '" + path + "': " + std::strerror(errno));
  }
  return load(path);
}

void ApiTokens::add(ApiRole role, const std::string& token) { tokens_.emplace_back(role, token); }

ApiRole ApiTokens::role_of(const std::string& authorization) const {
  const std::string prefix = "Bearer ";
  if (authorization.compare(0, prefix.size(), prefix) != 0) return ApiRole::None;
  const std::string given = authorization.substr(prefix.size());
  ensure_sodium();
  ApiRole best = ApiRole::None;
  for (const auto& [role, token] : tokens_)  // every token compared, in constant time each
    if (token.size() == given.size() && sodium_memcmp(token.data(), given.data(), token.size()) == 0 &&
        static_cast<int>(role) > static_cast<int>(best))
      best = role;
  return best;
}

std::string ApiTokens::token(ApiRole role) const {
  for (const auto& [r, t] : tokens_)
    if (r == role) return t;
  return "";
}

std::string sign_request(const std::string& cluster, const unsigned char* secret_key, const std::string& method,
                         const std::string& path, const std::string& body, int64_t unix_time) {
  ensure_sodium();
  unsigned char raw[8];
  randombytes_buf(raw, sizeof raw);
  const std::string nonce = hex(raw, sizeof raw);
  const std::string text = signed_text(method, path, unix_time, nonce, body);
  unsigned char sig[crypto_sign_BYTES];
  crypto_sign_detached(sig, nullptr, reinterpret_cast<const unsigned char*>(text.data()), text.size(), secret_key);
  return cluster + " " + std::to_string(unix_time) + " " + nonce + " " + hex(sig, sizeof sig);
}

SignedBy RequestVerifier::verify(const std::string& header, const std::string& method, const std::string& path,
                                 const std::string& body, int64_t now) {
  ensure_sodium();
  std::istringstream words(header);
  std::string cluster, time_text, nonce, sig_hex, extra;
  if (header.empty())
    return {"", "this request must be signed by the cluster it concerns (" + std::string(kSignatureHeader) +
                    "; `crosstrain cluster register --key NAME.key` signs it)"};
  if (!(words >> cluster >> time_text >> nonce >> sig_hex) || (words >> extra) || time_text.size() > 18 ||
      nonce.size() > 64)
    return {"", std::string(kSignatureHeader) + " must be \"CLUSTER UNIX_TIME NONCE SIGNATURE\""};
  const auto key = keys_.find(cluster);
  if (key == keys_.end())
    return {"", "no public key for cluster '" + cluster + "': add it to the keys file the scheduler reads (--cluster-keys)"};
  int64_t time = 0;
  try {
    size_t used = 0;
    time = std::stoll(time_text, &used);
    if (used != time_text.size()) throw std::invalid_argument("trailing");
  } catch (const std::exception&) {
    return {"", "the signature's time '" + time_text + "' is not a number"};
  }
  if (time < now - kSkewSeconds || time > now + kSkewSeconds)
    return {"", "the signature's time is more than " + std::to_string(kSkewSeconds) +
                    " s from the scheduler's clock (check both clocks; a replayed request looks like this too)"};
  unsigned char sig[crypto_sign_BYTES];
  size_t sig_len = 0;
  if (sodium_hex2bin(sig, sizeof sig, sig_hex.data(), sig_hex.size(), nullptr, &sig_len, nullptr) != 0 ||
      sig_len != sizeof sig)
    return {"", "the signature is not " + std::to_string(crypto_sign_BYTES) + " bytes of hex"};
  const std::string text = signed_text(method, path, time, nonce, body);
  if (crypto_sign_verify_detached(sig, reinterpret_cast<const unsigned char*>(text.data()), text.size(),
                                  key->second.data()) != 0)
    return {"", "the signature of cluster '" + cluster + "' does not match this request (another key, or the "
                "request was changed on the way)"};
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto it = seen_.begin(); it != seen_.end();) it = it->second < now - 2 * kSkewSeconds ? seen_.erase(it) : ++it;
  if (!seen_.emplace(sig_hex, time).second) return {"", "this signed request was already served (a replay)"};
  return {cluster, ""};
}

}  // namespace crosstrain::scheduler
