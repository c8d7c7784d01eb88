// Reading the cluster identity of comm.identity and comm.peer_keys (the files of `crosstrain keys create`), and
// resolving a process's DataPlaneSecurity.
#include <nlohmann/json.hpp>
#include <sodium.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "crosstrain/comm/secure/encryption.h"
#include "crosstrain/core/error.h"
#include "crosstrain/core/names.h"

namespace crosstrain::comm {
namespace {

std::string read_text(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError(what + " '" + path + "' cannot be read: " + std::strerror(errno));
  std::ostringstream s;
  s << in.rdbuf();
  if (s.str().size() > (1 << 20)) throw UsageError(what + " '" + path + "' is larger than 1 MiB");
  return s.str();
}

nlohmann::json read_json(const std::string& path, const std::string& what) {
  try {
    return nlohmann::json::parse(read_text(path, what));
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(what + " '" + path + "' is not JSON (" + e.what() + ")");
  }
}

template <size_t N>
std::array<unsigned char, N> from_hex(const nlohmann::json& j, const std::string& where) {
  std::array<unsigned char, N> out{};
  size_t got = 0;
  const std::string text = j.is_string() ? j.get<std::string>() : "";
  if (sodium_hex2bin(out.data(), N, text.data(), text.size(), nullptr, &got, nullptr) != 0 || got != N)
    throw UsageError(where + " is not " + std::to_string(N) + " bytes of hex");
  return out;
}

}  // namespace

DataPlaneSecurity data_plane_security(const CommConfig& config, const std::string& secret, int cluster) {
  if (sodium_init() < 0) throw Error("libsodium failed to initialise (sodium_init)");
  DataPlaneSecurity s;
  s.secret = secret;
  s.cluster = cluster;
  if (!config.identity.empty()) {
    struct stat st {};
    if (stat(config.identity.c_str(), &st) == 0 && (st.st_mode & 077) != 0)
      throw UsageError("comm.identity '" + config.identity + "' may be read by others; a cluster's key must be "
                       "private to its owner: chmod 600 " + config.identity);
    const nlohmann::json key = read_json(config.identity, "comm.identity");
    if (!key.is_object()) throw UsageError("comm.identity '" + config.identity + "' is not a key file");
    s.identity_cluster = key.value("cluster", "");
    check_name("comm.identity's cluster", s.identity_cluster);
    const auto sk = from_hex<64>(key.value("secret_key", nlohmann::json()), "comm.identity's secret_key");
    s.identity_key.assign(sk.begin(), sk.end());
    const nlohmann::json peers = read_json(config.peer_keys, "comm.peer_keys");
    if (!peers.is_object() || peers.empty())
      throw UsageError("comm.peer_keys '" + config.peer_keys + "' must be a JSON object of cluster -> public key");
    for (const auto& [name, hex] : peers.items()) {
      check_name("a cluster of comm.peer_keys", name);
      s.peer_keys[name] = from_hex<32>(hex, "comm.peer_keys' key of '" + name + "'");
    }
    if (!s.peer_keys.count(s.identity_cluster))
      throw UsageError("comm.peer_keys '" + config.peer_keys + "' lacks this cluster ('" + s.identity_cluster +
                       "'): the peers could not check its signatures either");
  }
  s.mode = resolve_encrypt_mode(config.encrypt, !secret.empty() || s.has_identity());
  return s;
}

}  // namespace crosstrain::comm
