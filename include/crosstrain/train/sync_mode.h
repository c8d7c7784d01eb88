// The sync modes (sync.mode, docs/wan-training.md) as a type, and what each implies for the rest of a run.
//
// The mode is named in one place (parse_sync_mode, when the config is read: SyncConfig::mode holds the enum);
// everything else asks its traits, so a new mode is a class in src/sync/, an enum value and a row of traits here,
// not a string compared in ten files.
#pragma once

#include <cstdint>
#include <string>

namespace crosstrain::train {

struct SyncConfig;  // train/config.h

enum class SyncMode { Sync, DiLoCo, Ssp, Async, Gossip };

// UsageError naming the choices for anything else.
SyncMode parse_sync_mode(const std::string& name);
const char* to_string(SyncMode mode);

// When the ranks of a run can hear a Ctrl-C together (train/stop_vote.h): every `every` steps each rank posts its
// vote, and reads the result `lag` steps later (1 <= lag <= every), at the same step on every rank. Reading it
// waits for the slowest rank to have posted: the cadence is chosen so that this wait is one the mode has anyway.
// With `every` = 0 there is no vote: the request travels with the parameter-server pushes instead (async, whose
// ranks never wait for each other; Job::ask_to_stop).
struct StopCheck {
  int64_t every = 1;
  int64_t lag = 1;
};

struct SyncTraits {
  SyncMode mode;
  // Every replica takes every step together: a per-step exchange (the Ctrl-C vote, straggler timings, elastic
  // votes) costs no extra waiting.
  bool lockstep;
  // Lockstep: every step, read at the next one. DiLoCo: at each outer step (every sync.inner_steps), where the
  // clusters meet. ssp: every sync.staleness + 1 steps, read as many steps later: a rank that far ahead of the
  // slowest waits for it anyway. gossip: every 4 exchange periods, read as many steps later (a rank more than that
  // far ahead waits there; its neighbours rarely let it get so far). async: no vote (every = 0), the pushes
  // carry it.
  StopCheck stop_check;
  // Replicas average inside their cluster, then across clusters: the mode needs the cluster groups, the same
  // number of ranks in every cluster (diloco; sync with sync.hierarchical).
  bool cluster_groups;
  // Workers push to and pull from a sharded parameter server; they report staleness (ssp, async).
  bool parameter_server;
  // Elastic training (jobs/gpt/elastic.h) can rebuild its groups: sync (not hierarchical: its clusters must stay
  // balanced), diloco with a whole cluster as the unit that leaves and joins, and the modes whose replicas step
  // alone (ssp and async re-shard their parameter server over the live workers; gossip pairs the live ranks).
  bool elastic;
};

SyncTraits sync_traits(const SyncConfig& config);

}  // namespace crosstrain::train
