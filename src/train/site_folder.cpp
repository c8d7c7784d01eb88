#include "site_folder.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <vector>

#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/core/error.h"
#include "crosstrain/train/site_stager.h"

namespace crosstrain::train {
namespace fs = std::filesystem;

namespace {

constexpr size_t kReportedCommitted = 2;  // the newest committed steps a site reports (the holders of last resort)
constexpr size_t kReportedStaging = 16;

std::optional<nlohmann::json> read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

// step_00000042 or step_00000042.staging: the step; nullopt for anything else.
std::optional<int64_t> step_of(const std::string& name, const std::string& suffix) {
  const std::string prefix = "step_";
  if (name.size() != prefix.size() + 8 + suffix.size() || name.compare(0, prefix.size(), prefix) != 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
    return std::nullopt;
  const std::string digits = name.substr(prefix.size(), 8);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  return std::stoll(digits);
}

int64_t size_or_zero(const fs::path& path) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  return ec ? 0 : static_cast<int64_t>(size);
}

// The files of a checkpoint as its own writers described them; checked like a peer's report (a damaged file here
// must not make this site's report one the others refuse).
std::optional<StepHolding> holding(const nlohmann::json& files, const std::string& origin, int64_t step,
                                   bool committed) {
  nlohmann::json as_report = {{"steps", {{{"step", step}, {"committed", committed}, {"origin", origin},
                                           {"files", files}, {"have", nlohmann::json::object()}}}}};
  try {
    return inventory_from_json(as_report).steps.at(0);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// A committed checkpoint made by a stager (its manifest's info lists the files), as a holder of its files.
std::optional<StepHolding> committed_holding(const fs::path& dir, int64_t step) {
  const auto manifest = read_json(dir / "manifest.json");
  if (!manifest || !manifest->is_object() || !manifest->contains("info") || !(*manifest)["info"].is_object())
    return std::nullopt;
  const nlohmann::json& info = (*manifest)["info"];
  if (!info.contains("site_files") || !info.value("site_origin", nlohmann::json("")).is_string()) return std::nullopt;
  auto h = holding(info["site_files"], info.value("site_origin", std::string()), step, true);
  if (h)
    for (const auto& [name, f] : h->files) h->have[name] = size_or_zero(dir / name) == f.size ? f.size : 0;
  return h;
}

// A copy being gathered: a file under its own name is whole (its site's own, or checked on arrival); NAME.part is
// what arrived of it so far.
std::optional<StepHolding> staging_holding(const fs::path& dir, int64_t step) {
  const auto staging = read_json(dir / kStagingFile);
  if (!staging || !staging->is_object() || !staging->contains("files") ||
      !staging->value("origin", nlohmann::json("")).is_string())
    return std::nullopt;
  auto h = holding((*staging)["files"], staging->value("origin", std::string()), step, false);
  if (!h) return std::nullopt;
  for (const auto& [name, f] : h->files) {
    if (fs::exists(dir / name)) {
      h->have[name] = size_or_zero(dir / name) == f.size ? f.size : 0;
    } else if (const int64_t part = size_or_zero(dir / (name + ".part")); part > 0) {
      h->have[name] = std::min(part, f.size - 1);  // never "whole" before its checksum held
    }
  }
  return h;
}

}  // namespace

SiteLock::SiteLock(const fs::path& root, std::chrono::seconds patience) {
  fs::create_directories(root);
  const fs::path path = root / ".staging.lock";
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error("cannot open " + path.string() + ": " + std::strerror(errno));
  const auto deadline = std::chrono::steady_clock::now() + patience;
  while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    if (error != EWOULDBLOCK || std::chrono::steady_clock::now() > deadline) {
      ::close(fd_);
      throw Error(error != EWOULDBLOCK
                      ? "cannot lock " + path.string() + ": " + std::strerror(error) +
                            " (the file system must support flock, e.g. Lustre mounted with -o flock)"
                      : "another stager held " + path.string() + " for " + std::to_string(patience.count()) + " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

SiteLock::~SiteLock() { ::close(fd_); }

Descriptor::~Descriptor() {
  if (fd_ >= 0) ::close(fd_);
}

bool Descriptor::close() {
  const int fd = fd_;
  fd_ = -1;
  return fd >= 0 && ::close(fd) == 0;
}

SiteInventory scan_site(const std::string& run_dir, const std::string& origin,
                        const std::set<std::string>& resend_whole, bool with_outputs) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  std::vector<StepHolding> committed, staging;
  std::vector<std::pair<int64_t, fs::path>> staging_dirs;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (const auto step = step_of(name, "")) {
      if (auto h = committed_holding(entry.path(), *step)) committed.push_back(std::move(*h));
    } else if (const auto staged = step_of(name, ".staging")) {
      staging_dirs.emplace_back(*staged, entry.path());
    }
  }
  int64_t newest = -1;  // of this placement's commits: another's never make this one's copies superfluous
  for (const StepHolding& h : committed)
    if (h.origin == origin) newest = std::max(newest, h.step);
  for (const auto& [step, dir] : staging_dirs) {
    std::optional<StepHolding> h = step > newest ? staging_holding(dir, step) : std::nullopt;
    if (h && h->origin == origin) {
      staging.push_back(std::move(*h));
    } else {
      fs::remove_all(dir, ec);  // superseded, another placement's (fenced off), or unreadable
    }
  }
  const auto newest_first = [](const StepHolding& a, const StepHolding& b) { return a.step > b.step; };
  std::sort(committed.begin(), committed.end(), newest_first);
  std::sort(staging.begin(), staging.end(), newest_first);
  SiteInventory inventory;
  for (size_t i = 0; i < committed.size() && i < kReportedCommitted; ++i) inventory.steps.push_back(committed[i]);
  for (size_t i = 0; i < staging.size() && i < kReportedStaging; ++i) inventory.steps.push_back(staging[i]);
  for (const std::string& name : with_outputs ? kStagedOutputs : std::vector<std::string>{}) {
    int64_t size = 0;
    const std::string sum = file_checksum((fs::path(run_dir) / name).string(), &size);
    if (resend_whole.count(name)) inventory.outputs[name] = StagedFile{0, Fnv1a().hex()};
    else if (!sum.empty()) inventory.outputs[name] = StagedFile{size, sum};
  }
  return inventory;
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

std::optional<Fnv1a> sum_of_prefix(const fs::path& path, int64_t bytes) {
  Fnv1a sum;
  if (bytes == 0) return sum;
  std::ifstream in(path, std::ios::binary);
  std::vector<uint8_t> buffer(1 << 20);
  for (int64_t at = 0; at < bytes && in;) {
    const int64_t len = std::min<int64_t>(static_cast<int64_t>(buffer.size()), bytes - at);
    in.read(reinterpret_cast<char*>(buffer.data()), len);
    if (in.gcount() != len) return std::nullopt;
    sum.add(buffer.data(), static_cast<size_t>(len));
    at += len;
  }
  return in ? std::optional<Fnv1a>(sum) : std::nullopt;
}

}  // namespace crosstrain::train
