// A site's checkpoints folder as the stager (site_stager.h) sees it: what it holds, reported for the plan, and the
// local pieces of staging (a lock between stagers, files read and written a chunk at a time). Private to src/train.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <set>
#include <string>

#include "crosstrain/train/checkpoint_sites.h"
#include "crosstrain/train/staging_plan.h"

namespace crosstrain::train {

// One stager at a time works in a site's checkpoints folder: a generation that ended may still be finishing a
// local commit while the next one's stager starts (flock: also between two descriptors of one process). A file
// system without flock is an error that says so, not a wait.
class SiteLock {
 public:
  SiteLock(const std::filesystem::path& root, std::chrono::seconds patience);
  ~SiteLock();
  SiteLock(const SiteLock&) = delete;
  SiteLock& operator=(const SiteLock&) = delete;

 private:
  int fd_ = -1;
};

// A file descriptor closed on every path.
class Descriptor {
 public:
  explicit Descriptor(int fd) : fd_(fd) {}
  ~Descriptor();
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  int get() const { return fd_; }
  bool close();  // false when closing failed (the last writes may be lost)

 private:
  int fd_;
};

// This site's report for the placement `origin` (run.fence). Copies this placement will never need are removed
// first: another placement's, and those older than the site's newest commit of this placement. With
// `with_outputs`, the run's outputs too (each read whole for its checksum: only for a report, not for a look at the
// checkpoints); those named in `resend_whole` are reported as empty (their copy did not check: the next one comes
// whole).
SiteInventory scan_site(const std::string& run_dir, const std::string& origin,
                        const std::set<std::string>& resend_whole, bool with_outputs = true);

// The FNV-1a state after the first `bytes` of a file (a resumed transfer continues the sum).
std::optional<Fnv1a> sum_of_prefix(const std::filesystem::path& path, int64_t bytes);
bool write_all(int fd, const uint8_t* p, size_t n);

}  // namespace crosstrain::train
