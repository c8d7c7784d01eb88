// The typed configuration of a training run, read from TOML with `section.key=value` overrides.
//
// Every section is a struct owned by the component that uses it; this file only maps keys to fields, so an
// unknown key is reported with the valid keys of its section and a wrongly typed value with the expected type.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "crosstrain/checkpoint/faults.h"
#include "crosstrain/comm/config.h"
#include "crosstrain/data/dataset.h"
#include "crosstrain/models/gpt_config.h"
#include "crosstrain/obs/config.h"
#include "crosstrain/parallel/parallel_dims.h"
#include "crosstrain/recsys/dlrm_config.h"
#include "crosstrain/train/sync_mode.h"

namespace crosstrain::train {

struct RunConfig {
  std::string name = "run";
  std::string dir = "runs/run";   // resolved config, metrics.jsonl and checkpoints/
  uint64_t seed = 1337;
  int64_t log_every = 1;          // progress lines (metrics.jsonl gets every step)
  std::string secret_file;        // a file (mode 0600) holding the job secret; CROSSTRAIN_SECRET takes precedence
  bool work_log = false;          // RUN_DIR/work/cluster<K>.jsonl for ledger claims (ledger/work_log.h)
  std::string fence;              // the placement owning run.dir (the scheduler's): commits need RUN_DIR/FENCE to match
  std::string site;               // the storage run.dir is on ("": one file system for every rank; checkpoint_sites.h)
};

struct TrainConfig {
  int64_t steps = 100;
  int64_t global_batch = 16;      // sequences per optimizer step, over all data-parallel ranks
  int64_t micro_batches = 1;      // per step and data-parallel rank: accumulation, and a pipeline's (at least pp)
  double lr = 1e-3;
  double min_lr = 1e-4;
  int64_t warmup_steps = 10;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;         // 0 disables clipping
  int64_t eval_every = 50;        // 0 disables validation
  int64_t eval_batches = 4;
  int64_t checkpoint_every = 0;   // 0: only at the end
  int64_t keep_checkpoints = 3;   // the newest K complete checkpoints are kept; 0 keeps all
  bool async_checkpoint = false;  // write checkpoints on a background thread while training continues
  int64_t sample_tokens = 200;    // generated at the end by rank 0; 0 disables
  double peak_flops_per_rank = 0; // for MFU; 0: this rank's best one-thread GEMM rate at the model's shapes
  int64_t threads_per_rank = 1;
  std::string precision = "fp32"; // fp32, or bf16: bf16 parameters and gradients, fp32 master weights (any layout)
  // Fine-tuning: the parameters kept fixed (models::frozen_parameters: "embedding", "head", "0-5", "all");
  // "" freezes nothing, or all but the LoRA adapters when model.lora_rank > 0.
  std::string freeze;
  std::string recompute = "none"; // none, selective (attention core) or full (whole blocks): activations redone in backward
};

using ParallelConfig = parallel::ParallelConfig;  // [parallel]: parallel/parallel_dims.h

using CommConfig = comm::CommConfig;  // [comm]: comm/config.h

// Synchronization across data-parallel replicas and clusters (docs/wan-training.md).
struct SyncConfig {
  SyncMode mode = SyncMode::Sync;  // sync, diloco, ssp, async, gossip (train/sync_mode.h)
  int64_t clusters = 0;           // 0: from sync.topology, else CROSSTRAIN_CLUSTER (or the testbed's CT_CLUSTER) per node, else 1
  std::string topology;           // a topology TOML (hosts and their clusters): each rank finds its host's cluster
  bool hierarchical = false;      // sync: gradients all-reduced inside each cluster, then across clusters
  int64_t inner_steps = 50;       // diloco: H, inner steps between outer steps
  double outer_lr = 0.7;          // diloco: outer SGD learning rate
  double outer_momentum = 0.9;    // diloco: outer momentum
  bool nesterov = true;           // diloco: Nesterov momentum
  std::string compression = "none";  // diloco outer gradients only: none, bf16, fp16, int8, int4, ...
  int64_t fragments = 1;          // diloco: > 1 streams parameter fragments on a staggered schedule
  int64_t overlap_steps = 1;      // streaming diloco: inner steps a fragment's exchange overlaps with
  // diloco: sequences per step of each cluster, e.g. "24,8" (a faster cluster takes more; the planner's
  // Layout::cluster_batch); adds up to train.global_batch. Empty: the global batch split evenly over the ranks.
  std::string cluster_batch;
  // diloco: data-parallel ranks of each cluster in rank order, e.g. "2,1,1" (clusters of different sizes, as the
  // scheduler places them); adds up to the data-parallel ranks. Empty: sync.clusters equal blocks (or the hints).
  std::string cluster_ranks;
  int64_t period = 1;             // gossip, async, ssp: steps between exchanges
  int64_t staleness = 4;          // ssp: a rank runs at most this many steps ahead of the slowest
  int64_t slow_rank = -1;         // experiments: this rank sleeps slow_ms per step (a slower device)
  double slow_ms = 0;
};

// [debug]: switches for tests only, each the component's own struct; a run never needs them. Kept out of the
// components' production settings so that no test switch hides in an environment variable.
// [elastic] Training that survives failures and joins (docs/elastic.md): membership by heartbeats, a generation
// of live replicas agreed at every step, state healed from a live peer. `crosstrain train --max-restarts N` or
// `--nnodes MIN:MAX` turn it on as well.
struct ElasticConfig {
  bool enabled = false;
  int64_t heartbeat_ms = 100;        // each rank's heartbeat period
  int64_t failure_timeout_ms = 500;  // a rank silent this long is dead (its replica leaves)
  int64_t min_replicas = 1;          // train on while at least this many replicas are live
  int64_t max_restarts = 0;          // the launcher restarts failed ranks this many times in all
  // When each step's vote is cast (step_voter.h). "auto": while the rank applies its update and computes the next
  // step where that costs nothing (replicas of one rank: a step some survivors applied is kept, and the others
  // heal from them), in line elsewhere. "always": overlapped everywhere; a replica of several ranks (tensor,
  // pipeline, HSDP, a DiLoCo cluster) keeps a copy of each rank's model and optimizer state from before the
  // update, to go back to if the step aborts. "never": every rank waits for the step's fate before its update.
  std::string overlap_votes = "auto";
  // DiLoCo: a joining cluster is taken in right after an outer step (INTELLECT-1's way), when every cluster holds
  // the just-averaged parameters, rather than at the next step with a copy of one cluster's inner phase. The
  // members go on in their generation until then (at most sync.inner_steps steps).
  bool join_at_outer_steps = true;
};

struct DebugConfig {
  // debug.fault_save_delay_ms, debug.fault_commit_rename: checkpoint storage faults (checkpoint/faults.h).
  checkpoint::StorageFaults checkpoint;
  // debug.elastic_kill / elastic_stop = "RANK@STEP" (or "all@STEP"): the first process of that rank sends
  // itself SIGKILL / SIGSTOP in the middle of that step, before its gradients are reduced (tests, chaos runs).
  std::string elastic_kill, elastic_stop;
  // debug.elastic_kill_at_vote = "RANK@STEP": the same SIGKILL once the rank's gradients of that step are reduced,
  // just before its vote (the others reduced with its gradients and may have voted and applied the step).
  std::string elastic_kill_at_vote;
  // debug.elastic_kill_at_outputs = "RANK@STEP": the same once the step's update is applied, before its
  // evaluation, checkpoint and metrics row.
  std::string elastic_kill_at_outputs;
  // debug.elastic_kill_heal = "RANK@N": restarted processes 1 to N of that rank send themselves SIGKILL while
  // they receive their state (a joiner that dies mid-heal, N times in a row).
  std::string elastic_kill_heal;
  bool elastic_digest = false;  // debug.elastic_digest: print each rank's state digest when a generation starts
  // debug.skip_collective = "RANK@STEP" (or "all@STEP"): that rank holds back its first collective of that step
  // and sleeps in it without issuing it (tests of the hang diagnosis: the others time out and must name it).
  std::string skip_collective;
};

struct Config {
  RunConfig run;
  models::GPTConfig model;
  // model.init_from: a Hugging Face model directory (config.json + model.safetensors) or a crosstrain
  // checkpoint whose weights the run starts from instead of the seeded initialisation ("": none).
  std::string model_init_from;
  data::DatasetConfig data;
  recsys::DlrmConfig dlrm;  // [dlrm]: model.arch = "dlrm" (recsys/dlrm_config.h)
  TrainConfig train;
  ParallelConfig parallel;
  CommConfig comm;
  SyncConfig sync;
  ElasticConfig elastic;
  obs::ObsConfig obs;
  DebugConfig debug;
};

// Reads `path` (TOML), then applies overrides "section.key=value" (value in TOML syntax; bare words are
// strings). Throws UsageError naming the file, key and expected type.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// The same from TOML text (e.g. the config saved in a checkpoint); `origin` names it in messages.
Config parse_config(const std::string& text, const std::string& origin);
// Applies one override to an existing config.
void apply_override(Config& config, const std::string& assignment);
// The complete resolved config as TOML (every key, defaults included).
std::string to_toml(const Config& config);
// The same TOML, every key followed by a comment with its help line, what it takes and its default
// (`crosstrain config`).
std::string describe_config(const Config& config);
// docs/config-reference.md: every key's section, type, default and help as Markdown tables
// (`crosstrain config --reference`).
std::string config_reference();
// What a config will do that its author may not expect, one line each (a run that ends inside its warm-up, a
// DiLoCo run that never reaches an outer step). Nothing here is an error.
std::vector<std::string> config_notices(const Config& config);
// The same for `ranks` ranks started on one host of `cores` cores: more compute threads than cores (each rank
// has train.threads_per_rank) make the ranks take turns, and every figure measured under that misleads.
std::vector<std::string> host_notices(const Config& config, int ranks, int cores);
// Per-key checks that need no world size (ranges, signs); load_config runs them after the overrides. Throws
// UsageError naming the key and its value. Checks across keys and ranks are in resolve() (jobs/trainer.h).
void check_ranges(const Config& config);
// sync.cluster_batch as counts (empty when the key is empty). Throws UsageError naming the key unless every
// count is a positive integer.
std::vector<int64_t> parse_cluster_batch(const std::string& text);
// sync.cluster_ranks as counts, the same way (empty when the key is empty).
std::vector<int64_t> parse_cluster_ranks(const std::string& text);
// The checks of sync.cluster_batch that need no layout: sync.mode = diloco, the sum is train.global_batch, one
// count per cluster where sync.clusters gives their number. check_ranges and the trainer run it.
void check_cluster_batch(const Config& config);
// The same for sync.cluster_ranks (diloco only; one count per cluster where sync.clusters or sync.cluster_batch
// give their number); the sum is checked against the layout in check_sync_config.
void check_cluster_ranks(const Config& config);

}  // namespace crosstrain::train
