#include "crosstrain/train/checkpoint_sites.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "crosstrain/checkpoint/distributed.h"

namespace crosstrain::train {
namespace fs = std::filesystem;

namespace {

// The stager's point-to-point tag on the world communicator (nothing else sends on it during a commit).
constexpr int kStageTag = 0x57a6e;
constexpr int64_t kChunkBytes = int64_t{64} << 20;

constexpr uint64_t kFnvBasis = 1469598103934665603ULL;

// FNV-1a, continued from `h` (a file's, chunk by chunk).
uint64_t fnv1a(const uint8_t* p, size_t n, uint64_t h = kFnvBasis) {
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ULL;
  }
  return h;
}

bool write_all(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// A file's size and FNV-1a, read a chunk at a time; nullopt when it cannot be read.
std::optional<std::pair<int64_t, uint64_t>> file_digest(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::vector<uint8_t> buffer(1 << 20);
  uint64_t h = kFnvBasis;
  int64_t size = 0;
  while (in) {
    in.read(reinterpret_cast<char*>(buffer.data()), static_cast<std::streamsize>(buffer.size()));
    const std::streamsize got = in.gcount();
    h = fnv1a(buffer.data(), static_cast<size_t>(got), h);
    size += got;
  }
  if (in.bad()) return std::nullopt;
  return std::make_pair(size, h);
}

}  // namespace

SiteMap site_map(const std::vector<int64_t>& site_hash_of_rank) {
  SiteMap m;
  std::map<int64_t, int> index;
  for (size_t r = 0; r < site_hash_of_rank.size(); ++r) {
    auto [it, added] = index.emplace(site_hash_of_rank[r], static_cast<int>(m.leaders.size()));
    if (added) m.leaders.push_back(static_cast<int>(r));
    m.site_of.push_back(it->second);
  }
  return m;
}

SiteMap map_sites(comm::Communicator& world, const std::string& site) {
  const int64_t mine = static_cast<int64_t>(std::hash<std::string>{}(site) & 0x7fffffffffffffffULL);
  at::Tensor all = at::empty({world.size()}, at::kLong);
  world.all_gather(at::full({1}, mine, at::kLong), all)->wait();
  return site_map(std::vector<int64_t>(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + world.size()));
}

std::string file_checksum(const std::string& path) {
  const auto digest = file_digest(path);
  if (!digest) return "";
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(digest->second));
  return hex;
}

std::string stage_piece_files(comm::Communicator& world, const SiteMap& sites, const std::string& tmp_dir) {
  if (sites.sites() < 2) return "";
  const int me = world.rank(), n = world.size();
  // Each rank's file: its size (-1: none, or unreadable) and checksum, known to all. Files are read and written a
  // chunk at a time: a rank holds at most one chunk of a file in memory, however large the checkpoint.
  const fs::path own = fs::path(tmp_dir) / checkpoint::piece_file_name(me);
  std::string failure;
  int64_t size = -1, sum = 0;
  if (fs::exists(own)) {
    const auto digest = file_digest(own);
    if (digest) {
      size = digest->first;
      sum = static_cast<int64_t>(digest->second);
    } else {
      failure = "cannot read " + own.string() + " to send it to the other sites";
    }
  }
  at::Tensor all = at::empty({2 * n}, at::kLong);
  world.all_gather(at::tensor({size, sum}, at::kLong), all)->wait();
  const auto* v = all.data_ptr<int64_t>();
  // In one order on every rank: rank r's file to each other site's leader, chunk by chunk, each transfer waited
  // for before the next (every rank meets the transfers it takes part in in the same order, so none waits on one
  // that another has not reached).
  at::Tensor chunk = at::empty({kChunkBytes}, at::kByte);
  for (int r = 0; r < n; ++r) {
    const int64_t bytes = v[2 * r];
    if (bytes <= 0) continue;  // no pieces on that rank (a piece file is never empty: it has a header)
    for (int s = 0; s < sites.sites(); ++s) {
      const int leader = sites.leaders[s];
      if (s == sites.site_of[r] || (me != r && me != leader)) continue;
      if (me == r) {
        std::ifstream in(own, std::ios::binary);
        for (int64_t at = 0; at < bytes; at += kChunkBytes) {
          const int64_t len = std::min(kChunkBytes, bytes - at);
          at::Tensor piece = chunk.narrow(0, 0, len);
          in.read(reinterpret_cast<char*>(piece.data_ptr<uint8_t>()), len);
          world.send(piece, leader, kStageTag)->wait();
        }
        continue;
      }
      // This rank leads site s: rank r's file into its own temporary directory, checked as it arrives.
      const fs::path path = fs::path(tmp_dir) / checkpoint::piece_file_name(r);
      fs::create_directories(tmp_dir);
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      uint64_t h = kFnvBasis;
      bool written = fd >= 0;
      for (int64_t at = 0; at < bytes; at += kChunkBytes) {
        const int64_t len = std::min(kChunkBytes, bytes - at);
        at::Tensor piece = chunk.narrow(0, 0, len);
        world.recv(piece, r, kStageTag)->wait();
        h = fnv1a(piece.data_ptr<uint8_t>(), static_cast<size_t>(len), h);
        written = written && write_all(fd, piece.data_ptr<uint8_t>(), static_cast<size_t>(len));
      }
      written = written && ::fsync(fd) == 0;
      if (fd >= 0) written = ::close(fd) == 0 && written;
      if (static_cast<int64_t>(h) != v[2 * r + 1]) {
        if (failure.empty())
          failure = "rank " + std::to_string(r) + "'s piece file arrived changed (its checksum does not match)";
      } else if (!written && failure.empty()) {
        failure = "cannot write " + path.string();
      }
    }
  }
  return failure;
}

}  // namespace crosstrain::train
