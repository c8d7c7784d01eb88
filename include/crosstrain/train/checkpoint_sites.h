// Checkpoints across sites without a shared file system (run.site, issue 35). Each rank names the site whose
// storage its run.dir is on; ranks of one site share it, ranks of different sites do not. A checkpoint is then
// committed at every site: each rank writes its piece file at its own site, and each site's first rank (its
// leader) gathers the other sites' files in the background (site_stager.h) over a group of the leaders carved
// from the job's own communicator (sealed where it crosses clusters, comm.encrypt), checking every file against
// its writer's checksum, and commits its site's copy once it is whole. Whichever site survives holds the newest
// checkpoint that reached it whole.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "crosstrain/comm/communicator.h"

namespace crosstrain::train {

// Which ranks share storage. All ranks with the same run.site ("" included: one shared file system) are a site.
struct SiteMap {
  std::vector<int> site_of;  // by rank: the index of its site (sites numbered by their lowest rank's order)
  std::vector<int> leaders;  // by site: its lowest rank
  int sites() const { return static_cast<int>(leaders.size()); }
  bool leads(int rank) const { return leaders[site_of[rank]] == rank; }
};
// Pure: the map from each rank's site name hash.
SiteMap site_map(const std::vector<int64_t>& site_hash_of_rank);
// Collective: every rank's run.site, all-gathered.
SiteMap map_sites(comm::Communicator& world, const std::string& site);

// FNV-1a, fed a chunk at a time: the checksum every staged file is checked against.
class Fnv1a {
 public:
  void add(const uint8_t* p, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      h_ ^= p[i];
      h_ *= 1099511628211ULL;
    }
  }
  uint64_t value() const { return h_; }
  std::string hex() const;
  static std::string hex(uint64_t value);

 private:
  uint64_t h_ = 1469598103934665603ULL;
};

// FNV-1a over a file's bytes (hex), as the stager checks them; "" when it cannot be read. With `size`, its size.
std::string file_checksum(const std::string& path, int64_t* size = nullptr);

}  // namespace crosstrain::train
