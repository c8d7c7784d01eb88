// Which checkpoint files go from which site to which (pure; site_stager.h does the moving). Every site's leader
// reports what it holds: its committed checkpoints and those it is still gathering, each with the files the
// checkpoint consists of and how many bytes of each the site has. From the same reports every leader computes
// the same plan, so the transfers pair up without further talk:
// - newest first: one step per round, the newest any site still needs (older ones wait, and are dropped at a site
//   once it has committed a newer one: SHARDCAST's rule, only the newest weights matter);
// - resumable: a file a site holds in part continues from its last byte;
// - only between sites that agree what the step's files are (the same names, sizes and checksums) and which
//   placement saved them (its fence token): a step saved twice, by two placements of the job, is never pieced
//   together from both, and a site's commit of another placement never makes it drop this one's copy.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace crosstrain::train {

struct StagedFile {
  int64_t size = 0;
  std::string checksum;  // FNV-1a of the bytes, 16 hex digits (file_checksum in checkpoint_sites.h)
  bool operator==(const StagedFile& o) const { return size == o.size && checksum == o.checksum; }
};

// One checkpoint step as one site holds it.
struct StepHolding {
  int64_t step = 0;
  bool committed = false;                   // step_N, complete; else being gathered (step_N.staging)
  std::string origin;                       // the placement that saved it (run.fence; "" unfenced)
  std::map<std::string, StagedFile> files;  // what the whole checkpoint's files are
  std::map<std::string, int64_t> have;      // bytes of each file the site holds (== size: the whole file)
  bool holds(const std::string& file) const;
  bool complete() const;  // every file whole
};

struct SiteInventory {
  std::vector<StepHolding> steps;
  // The run's outputs the site holds (kStagedOutputs), each as its size and the checksum of those bytes.
  std::map<std::string, StagedFile> outputs;
};

// The run's outputs that follow the checkpoints to every site: rank 0 writes them at the first site, and a job
// re-placed with its first share at another site goes on from the copy there (its history intact).
inline const std::vector<std::string> kStagedOutputs = {"metrics.jsonl"};

struct Transfer {
  int64_t step = 0;
  std::string file;
  int from = 0, to = 0;  // site indices
  int64_t offset = 0;    // the bytes the receiving site already has (it resumes there)
  StagedFile whole;
  bool operator==(const Transfer& o) const {
    return step == o.step && file == o.file && from == o.from && to == o.to && offset == o.offset && whole == o.whole;
  }
};

// The transfers of one round: of the newest step some site gathers (newer than its newest commit from the same
// placement) and can get something of, every file it lacks from the lowest-numbered site holding it whole; ordered
// by receiving site, then file name. Empty: nothing left that any site could get.
std::vector<Transfer> plan_staging(const std::vector<SiteInventory>& sites);

// The run's outputs the first site (rank 0's) holds and another site lacks or holds otherwise: appended from the
// other site's size when that is shorter (the file only grows between placements; the receiver checks the whole
// file against the checksum, and starts over when its older part differed), else sent whole. Transfer::step is -1.
std::vector<Transfer> plan_outputs(const std::vector<SiteInventory>& sites);

// A checkpoint piece file's name (rank-00003.safetensors): the only names a peer's report may carry, so none can
// point outside the checkpoint directory.
bool is_piece_file_name(const std::string& name);

nlohmann::json inventory_to_json(const SiteInventory& inventory);
// A peer's report, checked as hostile input: throws Error naming the first thing out of bounds (too many steps or
// files, a step twice, a name that is no piece file's, sizes, checksums, byte counts, origins).
SiteInventory inventory_from_json(const nlohmann::json& j);

}  // namespace crosstrain::train
