#include "keys_cmd.h"

#include <CLI/CLI.hpp>
#include <fcntl.h>
#include <sodium.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "crosstrain/core/error.h"
#include "crosstrain/ledger/ledger.h"

namespace crosstrain::apps {
namespace fs = std::filesystem;
using namespace crosstrain::scheduler;

namespace {

std::string hex(const unsigned char* data, size_t n) {
  std::string out(2 * n + 1, '\0');
  sodium_bin2hex(out.data(), out.size(), data, n);
  out.pop_back();
  return out;
}

// The first 16 hex digits of SHA-256 of a public key: short enough to read out over a phone.
std::string fingerprint(const std::array<unsigned char, 32>& key) {
  unsigned char d[crypto_hash_sha256_BYTES];
  crypto_hash_sha256(d, key.data(), key.size());
  return "SHA256:" + hex(d, 8);
}

std::string key_path(const KeysCli& cli) { return (fs::path(cli.dir) / (cli.cluster + ".key")).string(); }

int create(const KeysCli& cli) {
  const LedgerKey key = generate_ledger_key(cli.cluster);
  const std::string path = write_ledger_key(key, cli.dir);
  std::printf("cluster %s: key %s (0600), public key %s (%s); %s lists it\n", cli.cluster.c_str(), path.c_str(),
              hex(key.public_key.data(), 32).c_str(), fingerprint(key.public_key).c_str(),
              (fs::path(cli.dir) / "keys.json").c_str());
  return 0;
}

int show(const KeysCli& cli) {
  const std::string keys_file = (fs::path(cli.dir) / "keys.json").string();
  const PublicKeys keys = fs::exists(keys_file) ? read_public_keys(keys_file) : PublicKeys{};
  int problems = 0;
  std::printf("%-20s %-24s %s\n", "cluster", "fingerprint", "secret key");
  for (const auto& [name, pub] : keys) {
    const std::string path = (fs::path(cli.dir) / (name + ".key")).string();
    std::string state = "absent (this machine only verifies)";
    if (fs::exists(path)) {
      try {
        const LedgerKey k = read_ledger_key(path);  // refuses a key others may read
        state = k.public_key == pub ? "ok (0600)" : "DOES NOT MATCH keys.json: rotate it or restore the file";
        problems += k.public_key != pub;
      } catch (const UsageError& e) {
        state = std::string("PROBLEM: ") + e.what();
        ++problems;
      }
    }
    std::printf("%-20s %-24s %s\n", name.c_str(), fingerprint(pub).c_str(), state.c_str());
  }
  for (const auto& e : fs::directory_iterator(cli.dir))
    if (e.path().extension() == ".key" && !keys.count(e.path().stem().string())) {
      std::printf("%-20s %-24s NOT IN keys.json: peers cannot verify it\n", e.path().stem().c_str(), "-");
      ++problems;
    }
  if (keys.empty()) std::printf("(no keys in %s: crosstrain keys create --cluster NAME --dir %s)\n", cli.dir.c_str(),
                                cli.dir.c_str());
  return problems ? 1 : 0;
}

int rotate(const KeysCli& cli) {
  const std::string path = key_path(cli);
  const LedgerKey old = read_ledger_key(path);  // it must exist and be ours to rotate
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string retired = path + ".retired-" + std::to_string(now);
  const std::string keys_file = (fs::path(cli.dir) / "keys.json").string();
  const std::string old_keys = keys_file + ".retired-" + std::to_string(now);
  if (std::rename(path.c_str(), retired.c_str()) != 0)
    throw UsageError("keys rotate: cannot move " + path + " aside: " + std::strerror(errno));
  const PublicKeys before = read_public_keys(keys_file);
  try {
    write_public_keys(before, old_keys);  // what verifies the entries the old key signed
    PublicKeys without = before;
    without.erase(cli.cluster);
    write_public_keys(without, keys_file);
    const LedgerKey fresh = generate_ledger_key(cli.cluster);
    write_ledger_key(fresh, cli.dir);  // NAME.key, NAME.pub and NAME's entry in keys.json
    std::printf("cluster %s: new public key %s (%s), replacing %s; the old key is %s.\n"
                "Give the new %s to the scheduler (--cluster-keys) and to every verifier; ledger entries the old "
                "key signed verify with %s.\n",
                cli.cluster.c_str(), hex(fresh.public_key.data(), 32).c_str(), fingerprint(fresh.public_key).c_str(),
                fingerprint(old.public_key).c_str(), retired.c_str(), keys_file.c_str(), old_keys.c_str());
  } catch (...) {
    // Put the old key back: never leave a cluster without one.
    std::error_code ec;
    fs::remove((fs::path(cli.dir) / (cli.cluster + ".key")), ec);
    std::rename(retired.c_str(), path.c_str());
    write_public_keys(before, keys_file);
    throw;
  }
  return 0;
}

int secret(const KeysCli& cli) {
  if (sodium_init() < 0) throw Error("libsodium failed to initialise");
  unsigned char raw[32];
  randombytes_buf(raw, sizeof raw);
  const std::string text = hex(raw, sizeof raw) + "\n";
  sodium_memzero(raw, sizeof raw);
  const int fd = ::open(cli.out.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0)
    throw UsageError("keys secret: cannot create " + cli.out + ": " + std::strerror(errno) +
                     (errno == EEXIST ? " (it exists; a secret is never overwritten)" : ""));
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ::close(fd);
  if (!ok) throw UsageError("keys secret: cannot write " + cli.out);
  std::printf("a job secret in %s (0600): give every node the same file (run.secret_file = \"%s\"), or export "
              "CROSSTRAIN_SECRET=$(cat %s)\n",
              cli.out.c_str(), cli.out.c_str(), cli.out.c_str());
  return 0;
}

}  // namespace

bool KeysCli::selected() const { return (create && *create) || (show && *show) || (rotate && *rotate) || (secret && *secret); }

void add_keys_command(CLI::App& app, KeysCli& cli) {
  auto* keys = app.add_subcommand("keys", "the compute network's identities: create, show and rotate cluster keys; "
                                          "make job secrets (docs/security.md)");
  keys->require_subcommand(1);
  cli.create = keys->add_subcommand("create", "a cluster's Ed25519 key: DIR/NAME.key (0600), NAME.pub, keys.json");
  cli.show = keys->add_subcommand("show", "every cluster's fingerprint, and problems with the key files");
  cli.rotate = keys->add_subcommand("rotate", "a new key for a cluster; the old one is kept aside");
  for (CLI::App* c : {cli.create, cli.rotate}) c->add_option("--cluster", cli.cluster, "cluster name")->required();
  for (CLI::App* c : {cli.create, cli.show, cli.rotate})
    c->add_option("--dir", cli.dir, "folder of the key files")->required();
  cli.secret = keys->add_subcommand("secret", "a fresh job secret in a new file (0600)");
  cli.secret->add_option("--out", cli.out, "the file (never overwritten)")->required();
}

int run_keys_command(const KeysCli& cli) {
  if (*cli.create) return create(cli);
  if (*cli.show) return show(cli);
  if (*cli.rotate) return rotate(cli);
  return secret(cli);
}

}  // namespace crosstrain::apps
