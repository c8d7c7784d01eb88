#include "crosstrain/train/checkpoint_sites.h"

#include <ATen/ATen.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <map>

namespace crosstrain::train {

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

std::string Fnv1a::hex() const { return hex(h_); }

std::string Fnv1a::hex(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

std::string file_checksum(const std::string& path, int64_t* size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::vector<uint8_t> buffer(1 << 20);
  Fnv1a sum;
  int64_t bytes = 0;
  while (in) {
    in.read(reinterpret_cast<char*>(buffer.data()), static_cast<std::streamsize>(buffer.size()));
    const std::streamsize got = in.gcount();
    sum.add(buffer.data(), static_cast<size_t>(got));
    bytes += got;
  }
  if (in.bad()) return "";
  if (size) *size = bytes;
  return sum.hex();
}

}  // namespace crosstrain::train
