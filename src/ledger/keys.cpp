// Ledger keys: Ed25519 key pairs per cluster, their files, and the public keys file (ledger/ledger.h).
#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "crosstrain/core/error.h"
#include "crosstrain/ledger/ledger.h"
#include "internal.h"

namespace crosstrain::scheduler {
namespace fs = std::filesystem;
using nlohmann::json;

namespace ledger_detail {

void ensure_sodium() {
  static const bool ready = sodium_init() >= 0;
  if (!ready) throw std::runtime_error("libsodium could not be initialised");
}

std::string to_hex(const unsigned char* data, size_t size) {
  std::string out(size * 2 + 1, '\0');
  sodium_bin2hex(out.data(), out.size(), data, size);
  out.pop_back();
  return out;
}

bool from_hex(const std::string& hex, unsigned char* out, size_t size) {
  if (hex.size() != size * 2) return false;
  size_t written = 0;
  const char* end = nullptr;
  return sodium_hex2bin(out, size, hex.data(), hex.size(), nullptr, &written, &end) == 0 && written == size &&
         end == hex.data() + hex.size();
}

bool write_all(int fd, const std::string& text) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw UsageError("cannot write '" + tmp + "': " + std::strerror(errno) + "; check the folder exists and is writable");
  const bool ok = write_all(fd, text) && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) throw UsageError("cannot write '" + tmp + "': " + std::strerror(err));
  fs::rename(tmp, path);
}

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot read '" + path + "': " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool valid_cluster_name(const std::string& name) {
  if (name.empty() || name.size() > 64 || name[0] == '.') return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-')) return false;
  return true;
}

}  // namespace ledger_detail

using namespace ledger_detail;

namespace {

void check_cluster_name(const std::string& name) {
  if (!valid_cluster_name(name))
    throw UsageError("cluster name '" + name + "' is not usable: give 1-64 letters, digits, '.', '_' or '-' (not "
                     "starting with '.')");
}

}  // namespace

LedgerKey generate_ledger_key(const std::string& cluster) {
  check_cluster_name(cluster);
  ensure_sodium();
  LedgerKey key;
  key.cluster = cluster;
  crypto_sign_keypair(key.public_key.data(), key.secret_key.data());
  return key;
}

std::string write_ledger_key(const LedgerKey& key, const std::string& dir) {
  check_cluster_name(key.cluster);
  fs::create_directories(dir);
  const std::string keys_path = (fs::path(dir) / "keys.json").string();
  PublicKeys keys = fs::exists(keys_path) ? read_public_keys(keys_path) : PublicKeys{};
  if (keys.count(key.cluster))
    throw UsageError(keys_path + " already holds a public key for cluster '" + key.cluster +
                     "'; a new key would make its ledger entries unverifiable. Remove the cluster from it first if "
                     "you mean to replace the key");
  const std::string secret_path = (fs::path(dir) / (key.cluster + ".key")).string();
  // O_EXCL: a key is never overwritten; 0600 from the start, so it is never readable by others.
  const int fd = ::open(secret_path.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0)
    throw UsageError("cannot create '" + secret_path + "': " + std::strerror(errno) +
                     (errno == EEXIST ? " (a key for this cluster exists; keys are never overwritten)" : ""));
  const json doc = {{"cluster", key.cluster},
                    {"public_key", to_hex(key.public_key.data(), key.public_key.size())},
                    {"secret_key", to_hex(key.secret_key.data(), key.secret_key.size())}};
  const bool ok = write_all(fd, doc.dump() + "\n") && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok) throw UsageError("cannot write '" + secret_path + "': " + std::strerror(errno));
  write_file_atomically((fs::path(dir) / (key.cluster + ".pub")).string(),
                        to_hex(key.public_key.data(), key.public_key.size()) + "\n");
  keys[key.cluster] = key.public_key;
  write_public_keys(keys, keys_path);
  return secret_path;
}

LedgerKey read_ledger_key(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw UsageError("cannot read key file '" + path + "': " + std::strerror(errno));
  if (st.st_mode & 077) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 0777));
    throw UsageError("key file '" + path + "' has mode " + mode + ": others may read the secret key; run chmod 600 " + path);
  }
  json doc;
  try {
    doc = json::parse(read_whole_file(path));
  } catch (const json::exception& e) {
    throw UsageError("key file '" + path + "' is not JSON (" + e.what() + "); write it with `crosstrain ledger keygen`");
  }
  LedgerKey key;
  key.cluster = doc.value("cluster", "");
  check_cluster_name(key.cluster);
  if (!from_hex(doc.value("secret_key", ""), key.secret_key.data(), key.secret_key.size()) ||
      !from_hex(doc.value("public_key", ""), key.public_key.data(), key.public_key.size()))
    throw UsageError("key file '" + path + "' lacks a 64-byte hex secret_key or a 32-byte hex public_key");
  ensure_sodium();
  std::array<unsigned char, 32> derived{};
  crypto_sign_ed25519_sk_to_pk(derived.data(), key.secret_key.data());
  if (derived != key.public_key)
    throw UsageError("key file '" + path + "': its public_key is not the secret key's; the file is damaged");
  return key;
}

PublicKeys read_public_keys(const std::string& path) {
  json doc;
  try {
    doc = json::parse(read_whole_file(path));
  } catch (const json::exception& e) {
    throw UsageError("keys file '" + path + "' is not JSON (" + e.what() + "); it maps cluster names to hex public keys");
  }
  if (!doc.is_object()) throw UsageError("keys file '" + path + "' must be a JSON object {\"CLUSTER\": \"HEX\", ...}");
  PublicKeys keys;
  for (const auto& [name, value] : doc.items()) {
    std::array<unsigned char, 32> pk{};
    if (!value.is_string() || !from_hex(value.get<std::string>(), pk.data(), pk.size()))
      throw UsageError("keys file '" + path + "': the key of cluster '" + name + "' is not 64 hex digits");
    keys[name] = pk;
  }
  return keys;
}

void write_public_keys(const PublicKeys& keys, const std::string& path) {
  json doc = json::object();
  for (const auto& [name, pk] : keys) doc[name] = to_hex(pk.data(), pk.size());
  write_file_atomically(path, doc.dump(2) + "\n");
}

}  // namespace crosstrain::scheduler
