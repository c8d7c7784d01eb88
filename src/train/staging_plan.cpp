#include "crosstrain/train/staging_plan.h"

#include <algorithm>
#include <cctype>
#include <optional>
#include <set>

#include "crosstrain/core/error.h"

namespace crosstrain::train {

namespace {

// Bounds on a peer's report: generous for real jobs, small enough that a hostile one cannot exhaust memory.
constexpr size_t kMaxSteps = 64;
constexpr size_t kMaxFiles = 1 << 16;
constexpr int64_t kMaxFileBytes = int64_t{1} << 42;
constexpr int64_t kMaxOutputBytes = int64_t{16} << 30;

// The lowest-numbered site other than `to` that holds `file` of `step`, whole, with the same files.
std::optional<int> holder_of(const std::vector<SiteInventory>& sites, int to, const StepHolding& wanted,
                             const std::string& file) {
  for (int s = 0; s < static_cast<int>(sites.size()); ++s) {
    if (s == to) continue;
    for (const StepHolding& h : sites[s].steps)
      if (h.step == wanted.step && h.origin == wanted.origin && h.files == wanted.files && h.holds(file)) return s;
  }
  return std::nullopt;
}

int64_t newest_committed(const SiteInventory& site, const std::string& origin) {
  int64_t newest = -1;
  for (const StepHolding& h : site.steps)
    if (h.committed && h.origin == origin) newest = std::max(newest, h.step);
  return newest;
}

// What site `to` could receive of `h` now.
std::vector<Transfer> wants(const std::vector<SiteInventory>& sites, int to, const StepHolding& h) {
  std::vector<Transfer> out;
  for (const auto& [name, whole] : h.files) {
    if (h.holds(name)) continue;
    const std::optional<int> from = holder_of(sites, to, h, name);
    if (!from) continue;
    const auto had = h.have.find(name);
    const int64_t offset = had != h.have.end() && had->second < whole.size ? had->second : 0;
    out.push_back(Transfer{h.step, name, *from, to, offset, whole});
  }
  return out;
}

[[noreturn]] void refuse(const std::string& why) { throw Error("a site's checkpoint report was refused: " + why); }

int64_t bounded(const nlohmann::json& j, int64_t lo, int64_t hi, const std::string& what) {
  if (!j.is_number_integer()) refuse(what + " is not an integer");
  const int64_t v = j.get<int64_t>();
  if (v < lo || v > hi) refuse(what + " = " + std::to_string(v) + " is out of bounds");
  return v;
}

bool is_checksum(const std::string& s) {
  return s.size() == 16 && std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(c) != 0; });
}

StepHolding holding_from_json(const nlohmann::json& j) {
  if (!j.is_object()) refuse("a step is not an object");
  StepHolding h;
  h.step = bounded(j.value("step", nlohmann::json()), 0, int64_t{1} << 50, "step");
  h.committed = j.value("committed", false);
  h.origin = j.value("origin", std::string());
  if (h.origin.size() > 256) refuse("an origin of " + std::to_string(h.origin.size()) + " characters");
  const nlohmann::json& files = j.value("files", nlohmann::json::object());
  const nlohmann::json& have = j.value("have", nlohmann::json::object());
  if (!files.is_object() || !have.is_object()) refuse("step " + std::to_string(h.step) + ": files are not objects");
  if (files.size() > kMaxFiles || have.size() > files.size()) refuse("too many files");
  for (const auto& [name, f] : files.items()) {
    if (!is_piece_file_name(name)) refuse("'" + name.substr(0, 64) + "' is no checkpoint piece file");
    if (!f.is_array() || f.size() != 2 || !f[1].is_string() || !is_checksum(f[1].get<std::string>()))
      refuse(name + ": no [size, checksum]");
    h.files[name] = StagedFile{bounded(f[0], 1, kMaxFileBytes, name + "'s size"), f[1].get<std::string>()};
  }
  for (const auto& [name, bytes] : have.items()) {
    const auto it = h.files.find(name);
    if (it == h.files.end()) refuse(name + " is held but not part of step " + std::to_string(h.step));
    h.have[name] = bounded(bytes, 0, it->second.size, name + "'s bytes held");
  }
  return h;
}

}  // namespace

bool StepHolding::holds(const std::string& file) const {
  const auto f = files.find(file);
  const auto h = have.find(file);
  return f != files.end() && h != have.end() && h->second == f->second.size;
}

bool StepHolding::complete() const {
  return std::all_of(files.begin(), files.end(), [&](const auto& f) { return holds(f.first); });
}

std::vector<Transfer> plan_staging(const std::vector<SiteInventory>& sites) {
  std::map<int64_t, std::vector<Transfer>> by_step;  // newest last
  for (int to = 0; to < static_cast<int>(sites.size()); ++to) {
    for (const StepHolding& h : sites[to].steps) {
      if (h.committed || h.step <= newest_committed(sites[to], h.origin)) continue;
      for (Transfer& t : wants(sites, to, h)) by_step[h.step].push_back(std::move(t));
    }
  }
  if (by_step.empty()) return {};
  return by_step.rbegin()->second;  // sites in order, then files in name order (the loops' order)
}

std::vector<Transfer> plan_outputs(const std::vector<SiteInventory>& sites) {
  std::vector<Transfer> out;
  if (sites.empty()) return out;
  for (const auto& [name, whole] : sites[0].outputs)
    for (int to = 1; to < static_cast<int>(sites.size()); ++to) {
      const auto held = sites[to].outputs.find(name);
      if (held != sites[to].outputs.end() && held->second == whole) continue;
      const int64_t offset = held != sites[to].outputs.end() && held->second.size < whole.size ? held->second.size : 0;
      out.push_back(Transfer{-1, name, 0, to, offset, whole});
    }
  return out;
}

bool is_piece_file_name(const std::string& name) {
  const std::string prefix = "rank-", suffix = ".safetensors";
  if (name.size() <= prefix.size() + suffix.size() || name.size() > prefix.size() + 9 + suffix.size()) return false;
  if (name.compare(0, prefix.size(), prefix) != 0) return false;
  if (name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return false;
  const std::string digits = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  return std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
}

nlohmann::json inventory_to_json(const SiteInventory& inventory) {
  nlohmann::json steps = nlohmann::json::array();
  for (const StepHolding& h : inventory.steps) {
    nlohmann::json files = nlohmann::json::object(), have = nlohmann::json::object();
    for (const auto& [name, f] : h.files) files[name] = {f.size, f.checksum};
    for (const auto& [name, bytes] : h.have) have[name] = bytes;
    steps.push_back(
        {{"step", h.step}, {"committed", h.committed}, {"origin", h.origin}, {"files", files}, {"have", have}});
  }
  nlohmann::json outputs = nlohmann::json::object();
  for (const auto& [name, f] : inventory.outputs) outputs[name] = {f.size, f.checksum};
  return {{"steps", steps}, {"outputs", outputs}};
}

SiteInventory inventory_from_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("steps") || !j["steps"].is_array()) refuse("no list of steps");
  if (j["steps"].size() > kMaxSteps) refuse(std::to_string(j["steps"].size()) + " steps (at most 64)");
  SiteInventory inventory;
  try {
    std::set<std::pair<int64_t, bool>> seen;
    for (const nlohmann::json& s : j["steps"]) {
      inventory.steps.push_back(holding_from_json(s));
      if (!seen.insert({inventory.steps.back().step, inventory.steps.back().committed}).second)
        refuse("step " + std::to_string(inventory.steps.back().step) + " is reported twice");
    }
    const nlohmann::json& outputs = j.value("outputs", nlohmann::json::object());
    if (!outputs.is_object()) refuse("outputs are not an object");
    for (const auto& [name, f] : outputs.items()) {
      if (std::find(kStagedOutputs.begin(), kStagedOutputs.end(), name) == kStagedOutputs.end())
        refuse("'" + name.substr(0, 64) + "' is no output that is staged");
      if (!f.is_array() || f.size() != 2 || !f[1].is_string() || !is_checksum(f[1].get<std::string>()))
        refuse(name + ": no [size, checksum]");
      inventory.outputs[name] = StagedFile{bounded(f[0], 0, kMaxOutputBytes, name + "'s size"), f[1].get<std::string>()};
    }
  } catch (const nlohmann::json::exception& e) {
    refuse(e.what());
  }
  return inventory;
}

}  // namespace crosstrain::train
