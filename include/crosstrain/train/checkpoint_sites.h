// Checkpoints across sites without a shared file system (run.site, issue 35). Each rank names the site whose
// storage its run.dir is on; ranks of one site share it, ranks of different sites do not. A checkpoint is then
// committed at every site: each rank's piece file goes from its site to the first rank (the leader) of every other
// site over the job's own communicator (sealed where it crosses clusters, comm.encrypt), which checks it against
// the sender's checksum and writes it into its site's temporary directory; then each leader commits its site's
// copy. Whichever site survives holds the newest checkpoint, complete.
#pragma once

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

// Collective, once every rank's piece file of the save is in its site's `tmp_dir`: sends each to every other
// site's leader in chunks of at most 64 MiB (all the memory it takes), which writes it there and checks its
// FNV-1a checksum. Returns "" or why this rank's part failed (a file it could not read or write, a checksum that
// does not match).
std::string stage_piece_files(comm::Communicator& world, const SiteMap& sites, const std::string& tmp_dir);

// FNV-1a over a file's bytes (hex), as the stager checks them; "" when it cannot be read.
std::string file_checksum(const std::string& path);

}  // namespace crosstrain::train
