#include "crosstrain/train/sync_mode.h"

#include "crosstrain/core/error.h"
#include "crosstrain/train/config.h"

namespace crosstrain::train {
namespace {

struct Named {
  SyncMode mode;
  const char* name;
};

constexpr Named kModes[] = {{SyncMode::Sync, "sync"},
                            {SyncMode::DiLoCo, "diloco"},
                            {SyncMode::Ssp, "ssp"},
                            {SyncMode::Async, "async"},
                            {SyncMode::Gossip, "gossip"}};

}  // namespace

SyncMode parse_sync_mode(const std::string& name) {
  for (const auto& m : kModes)
    if (name == m.name) return m.mode;
  std::string names;
  for (const auto& m : kModes) names += std::string(names.empty() ? "" : ", ") + m.name;
  throw UsageError("sync.mode = '" + name + "': use " + names);
}

const char* to_string(SyncMode mode) {
  for (const auto& m : kModes)
    if (m.mode == mode) return m.name;
  return "?";
}

SyncTraits sync_traits(const SyncConfig& config) {
  SyncTraits t{};
  t.mode = config.mode;
  t.lockstep = t.mode == SyncMode::Sync;
  t.cluster_groups = t.mode == SyncMode::DiLoCo || (t.mode == SyncMode::Sync && config.hierarchical);
  t.parameter_server = t.mode == SyncMode::Ssp || t.mode == SyncMode::Async;
  t.elastic = t.mode == SyncMode::Sync && !config.hierarchical;
  return t;
}

}  // namespace crosstrain::train
