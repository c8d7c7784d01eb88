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

}  // namespace

SyncMode parse_sync_mode(const std::string& name) { return parse_enum(kModes, name, "sync.mode"); }

const char* to_string(SyncMode mode) { return enum_name(kModes, mode); }

SyncTraits sync_traits(const SyncConfig& config) {
  SyncTraits t{};
  t.mode = config.mode;
  t.lockstep = t.mode == SyncMode::Sync;
  t.meets_every = t.lockstep ? 1 : t.mode == SyncMode::DiLoCo ? std::max<int64_t>(1, config.inner_steps) : 0;
  t.cluster_groups = t.mode == SyncMode::DiLoCo || (t.mode == SyncMode::Sync && config.hierarchical);
  t.parameter_server = t.mode == SyncMode::Ssp || t.mode == SyncMode::Async;
  t.elastic = t.mode == SyncMode::Sync && !config.hierarchical;
  return t;
}

}  // namespace crosstrain::train
