#include "crosstrain/train/checkpoint_sites.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>

#include "crosstrain/checkpoint/distributed.h"

namespace crosstrain::train {
namespace fs = std::filesystem;

namespace {

// The stager's point-to-point tag on the world communicator (nothing else sends on it during a commit).
constexpr int kStageTag = 0x57a6e;
constexpr int64_t kChunkBytes = int64_t{64} << 20;

uint64_t fnv1a(const uint8_t* p, size_t n, uint64_t h = 1469598103934665603ULL) {
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ULL;
  }
  return h;
}

// The file's bytes on disk before the commit's rename, as write_pieces leaves its own.
bool write_synced(const fs::path& path, const std::vector<uint8_t>& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return false;
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w <= 0) break;
    done += static_cast<size_t>(w);
  }
  const bool ok = done == bytes.size() && ::fsync(fd) == 0;
  return ::close(fd) == 0 && ok;
}

bool read_all(const fs::path& path, std::vector<uint8_t>& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  out.assign(std::istreambuf_iterator<char>(in), {});
  return !in.bad();
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
  std::vector<uint8_t> bytes;
  if (!read_all(path, bytes)) return "";
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a(bytes.data(), bytes.size())));
  return hex;
}

std::string stage_piece_files(comm::Communicator& world, const SiteMap& sites, const std::string& tmp_dir) {
  if (sites.sites() < 2) return "";
  const int me = world.rank(), n = world.size();
  // Each rank's file: its size (-1: none, or unreadable) and checksum, known to all.
  std::vector<uint8_t> mine;
  const fs::path own = fs::path(tmp_dir) / checkpoint::piece_file_name(me);
  std::string failure;
  int64_t size = -1, sum = 0;
  if (fs::exists(own)) {
    if (read_all(own, mine)) {
      size = static_cast<int64_t>(mine.size());
      sum = static_cast<int64_t>(fnv1a(mine.data(), mine.size()));
    } else {
      failure = "cannot read " + own.string() + " to send it to the other sites";
    }
  }
  at::Tensor all = at::empty({2 * n}, at::kLong);
  world.all_gather(at::tensor({size, sum}, at::kLong), all)->wait();
  const auto* v = all.data_ptr<int64_t>();
  // In one order on every rank: rank r's file to each other site's leader, chunk by chunk. Sends are posted
  // without waiting, so a leader that also sends never blocks the others.
  std::vector<comm::WorkPtr> sends;
  std::vector<at::Tensor> keep;  // what the posted sends read
  for (int r = 0; r < n; ++r) {
    const int64_t bytes = v[2 * r];
    if (bytes <= 0) continue;  // no pieces on that rank (a piece file is never empty: it has a header)
    for (int s = 0; s < sites.sites(); ++s) {
      const int leader = sites.leaders[s];
      if (s == sites.site_of[r] || (me != r && me != leader)) continue;
      if (me == r) {
        for (int64_t at = 0; at < bytes; at += kChunkBytes) {
          const int64_t len = std::min(kChunkBytes, bytes - at);
          at::Tensor chunk = at::empty({len}, at::kByte);
          std::copy(mine.begin() + at, mine.begin() + at + len, chunk.data_ptr<uint8_t>());
          keep.push_back(chunk);
          sends.push_back(world.send(chunk, leader, kStageTag));
        }
        continue;
      }
      // This rank leads site s: receive rank r's file into its own temporary directory.
      std::vector<uint8_t> got(static_cast<size_t>(bytes));
      for (int64_t at = 0; at < bytes; at += kChunkBytes) {
        const int64_t len = std::min(kChunkBytes, bytes - at);
        at::Tensor chunk = at::empty({len}, at::kByte);
        world.recv(chunk, r, kStageTag)->wait();
        std::copy(chunk.data_ptr<uint8_t>(), chunk.data_ptr<uint8_t>() + len, got.begin() + at);
      }
      if (static_cast<int64_t>(fnv1a(got.data(), got.size())) != v[2 * r + 1]) {
        if (failure.empty())
          failure = "rank " + std::to_string(r) + "'s piece file arrived changed (its checksum does not match)";
        continue;
      }
      const fs::path path = fs::path(tmp_dir) / checkpoint::piece_file_name(r);
      fs::create_directories(tmp_dir);
      if (!write_synced(path, got) && failure.empty()) failure = "cannot write " + path.string();
    }
  }
  for (auto& w : sends) w->wait();
  return failure;
}

}  // namespace crosstrain::train
