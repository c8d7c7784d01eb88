// The sync modes (sync.mode, docs/wan-training.md) as a type, and what each implies for the rest of a run.
//
// The mode is named in one place (parse_sync_mode, when the config is read: SyncConfig::mode holds the enum);
// everything else asks its traits, so a new mode is a class in src/sync/, an enum value and a row of traits here,
// not a string compared in ten files.
#pragma once

#include <string>

namespace crosstrain::train {

struct SyncConfig;  // train/config.h

enum class SyncMode { Sync, DiLoCo, Ssp, Async, Gossip };

// UsageError naming the choices for anything else.
SyncMode parse_sync_mode(const std::string& name);
const char* to_string(SyncMode mode);

struct SyncTraits {
  SyncMode mode;
  // Every replica takes every step together: a per-step exchange (the Ctrl-C vote, straggler timings, elastic
  // votes) costs no extra waiting.
  bool lockstep;
  // Steps between the points where every rank meets anyway: 1 in lockstep, sync.inner_steps in DiLoCo (its outer
  // steps), 0 where ranks never all wait for each other (ssp, async, gossip). Ctrl-C stops a run there.
  int64_t meets_every;
  // Replicas average inside their cluster, then across clusters: the mode needs the cluster groups, the same
  // number of ranks in every cluster (diloco; sync with sync.hierarchical).
  bool cluster_groups;
  // Workers push to and pull from a sharded parameter server; they report staleness (ssp, async).
  bool parameter_server;
  // Elastic training (jobs/gpt/elastic.h) can rebuild its groups today.
  bool elastic;
};

SyncTraits sync_traits(const SyncConfig& config);

}  // namespace crosstrain::train
