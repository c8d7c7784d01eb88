#include "crosstrain/train/sync_mode.h"

#include <algorithm>

#include "crosstrain/core/error.h"
#include "crosstrain/core/named_enum.h"
#include "crosstrain/train/config.h"

namespace crosstrain::train {
namespace {

constexpr EnumName<SyncMode> kModes[] = {{SyncMode::Sync, "sync"},
                                         {SyncMode::DiLoCo, "diloco"},
                                         {SyncMode::Ssp, "ssp"},
                                         {SyncMode::Async, "async"},
                                         {SyncMode::Gossip, "gossip"}};

StopCheck stop_check_of(const SyncConfig& config) {
  const int64_t period = std::max<int64_t>(1, config.period);
  // A vote read as many steps after it was posted as it is posted apart: one vote in flight at a time.
  auto drifting = [](int64_t every) { return StopCheck{every, every}; };
  switch (config.mode) {
    case SyncMode::Sync: return {1, 1};
    case SyncMode::DiLoCo: return {std::max<int64_t>(1, config.inner_steps), 1};
    case SyncMode::Ssp: return drifting(std::max<int64_t>(0, config.staleness) + 1);
    case SyncMode::Async: return {0, 0};
    case SyncMode::Gossip: return drifting(4 * period);
  }
  return {1, 1};
}

}  // namespace

SyncMode parse_sync_mode(const std::string& name) { return parse_enum(kModes, name, "sync.mode"); }

const char* to_string(SyncMode mode) { return enum_name(kModes, mode); }

SyncTraits sync_traits(const SyncConfig& config) {
  SyncTraits t{};
  t.mode = config.mode;
  t.lockstep = t.mode == SyncMode::Sync;
  t.stop_check = stop_check_of(config);
  t.cluster_groups = t.mode == SyncMode::DiLoCo || (t.mode == SyncMode::Sync && config.hierarchical);
  t.parameter_server = t.mode == SyncMode::Ssp || t.mode == SyncMode::Async;
  // DiLoCo: a replica is a whole cluster (sync.clusters blocks), so the clusters stay balanced as they come and go.
  t.elastic = !(t.mode == SyncMode::Sync && config.hierarchical);
  return t;
}

}  // namespace crosstrain::train
