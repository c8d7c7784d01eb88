// The trainer's side of distributed checkpoints (checkpoint/distributed.h has the format): the training state
// beside the tensors, and a writer that can write on a background thread while training continues. Which pieces
// of the parameters and optimizer state a rank saves, and how a rank of any layout loads its part back, is the
// optimizer's (optimizer.h).
//
// Who writes what (StatePlacement in optimizer.h): a parameter replicated over the tensor-parallel group is
// written by tp rank 0 only; the writers of each copy of the model state (one copy where replicas are
// identical, one per cluster or replica where they may differ) each write an even share of every tensor, or
// with ZeRO exactly the slices they own, so all ranks write in parallel and nothing is written twice.
#pragma once

#include <ATen/core/Tensor.h>

#include <exception>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/comm/communicator.h"
#include "crosstrain/data/sampler.h"
#include "crosstrain/train/checkpoint_sites.h"
#include "crosstrain/train/site_stager.h"
#include "crosstrain/train/staging_plan.h"

namespace crosstrain::train {

struct CheckpointState {
  int64_t step = 0;  // last completed step
  data::SamplerState sampler;
  std::string config_toml;
  int dp = 1, pp = 1, tp = 1, zero = 0;
};

nlohmann::json state_to_info(const CheckpointState& state);
// Throws UsageError naming the manifest when fields are missing.
CheckpointState state_from_info(const checkpoint::CheckpointReader& reader);

// Saves collectively: every rank hands over its pieces; with `async` they are written by a background thread
// while training continues and committed (manifest + rename, by rank 0) at the next commit() call. `faults`
// (debug.fault_*, checkpoint/faults.h) are for tests; the defaults inject nothing.
class CheckpointWriter {
 public:
  // `fence` (run.fence): the placement token this run's commits must find in RUN_DIR/FENCE ("": no fencing).
  // `site` (run.site): the storage this rank's run_dir is on; ranks of different sites each get the whole
  // checkpoint committed at their site (checkpoint_sites.h). "" on every rank: one shared file system.
  CheckpointWriter(comm::Communicator& world, std::string run_dir, int keep_last, bool async, double timeout_s,
                   checkpoint::StorageFaults faults = {}, std::string fence = "", std::string site = "");
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Collective. Commits a pending save first.
  void save(int64_t step, std::vector<checkpoint::Piece> pieces, nlohmann::json info);
  bool pending() const { return pending_; }
  // Collective: waits for this rank's files and gathers every rank's piece records; then rank 0 writes the
  // manifest and renames, and all agree it held. At several sites (run.site) each site's leader hands the save to
  // its stager instead (site_stager.h), which gathers the other sites' files in the background and commits the
  // site's copy once it is whole. Returns this rank's (future) checkpoint directory. No-op without a pending save.
  std::string commit();
  // Collective, at the end of a run: waits until the checkpoints handed to the stagers have reached every site.
  // Throws Error when staging stopped (a site's copy then stays as far as it got, for the next placement).
  void drain();
  // This rank's stager's counts (zero where it leads no site, or with one shared file system).
  StagingStats staging_stats() const;
  // Tests: the stagers' message size (0: theirs).
  void set_stage_chunk_bytes(int64_t bytes) { stage_chunk_bytes_ = bytes; }

 private:
  comm::Communicator& world_;
  std::string run_dir_;
  int keep_last_;
  bool async_;
  double timeout_s_;
  checkpoint::StorageFaults faults_;
  std::string fence_, site_;
  bool pending_ = false;
  int64_t step_ = 0;
  nlohmann::json info_;
  std::thread thread_;
  std::vector<checkpoint::PieceRecord> records_;
  std::exception_ptr error_;
  bool stager_checked_ = false;  // the sites were looked at (a multi-site commit happened)
  int64_t stage_chunk_bytes_ = 0;
  std::unique_ptr<SiteStager> stager_;

  void agree_written(const SiteMap& sites);
  std::string commit_here(const std::vector<checkpoint::PieceRecord>& records);
  std::vector<StagedFile> gather_file_sums();
  std::string hand_to_stager(const SiteMap& sites, const std::vector<checkpoint::PieceRecord>& records,
                             const std::vector<StagedFile>& files);
  void ensure_stager(const SiteMap& sites);
};

}  // namespace crosstrain::train
