// `crosstrain keys`: the identities of a compute network in one place (docs/security.md).
//   keys create --cluster NAME --dir DIR   a cluster's Ed25519 key (DIR/NAME.key 0600, DIR/NAME.pub, DIR/keys.json)
//   keys show --dir DIR                    every cluster's public key and fingerprint, and what is wrong with the
//                                          files (a key others may read, a key that does not match keys.json)
//   keys rotate --cluster NAME --dir DIR   a new key; the old one kept as NAME.key.retired-TIME (0600) and
//                                          replaced in keys.json (give the scheduler and the peers the new file)
//   keys secret --out FILE                 a fresh job secret (0600), for run.secret_file or CROSSTRAIN_SECRET
// The cluster keys sign ledger claims, cluster registrations and link reports (scheduler/api_auth.h).
#pragma once

#include <string>

namespace CLI {
class App;
}

namespace crosstrain::apps {

struct KeysCli {
  CLI::App *create = nullptr, *show = nullptr, *rotate = nullptr, *secret = nullptr;
  std::string cluster, dir, out;
  bool selected() const;
};

void add_keys_command(CLI::App& app, KeysCli& cli);
int run_keys_command(const KeysCli& cli);

}  // namespace crosstrain::apps
