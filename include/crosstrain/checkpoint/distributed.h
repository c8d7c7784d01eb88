// Distributed checkpoints that reload into any layout.
//
// RUN_DIR/checkpoints/step_NNNNNNNN/ holds one safetensors file per writing rank (rank-RRRRR.safetensors) and
// manifest.json. Every tensor of the run (parameters, and optimizer state as "NAME#exp_avg", "NAME#exp_avg_sq")
// is stored as pieces: a piece is a contiguous range of the flattened tensor-parallel shard of the tensor,
// so both tensor parallelism (which shard) and ZeRO (which range of it) are described by the same record.
// The manifest lists, per tensor: its global (unsplit) shape, dtype, the parameter whose tensor-parallel
// split it follows, and every piece with its file, key, checksum and position. A loader rebuilds whole tensors
// from the pieces it needs and re-splits them for its own layout.
//
// Atomicity: every rank writes into step_N.tmp/; rank 0 writes the manifest last, syncs and renames the
// directory. A checkpoint directory without ".tmp" is complete; anything else is ignored and cleaned up.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "crosstrain/checkpoint/faults.h"

namespace crosstrain::checkpoint {

// The tensor-parallel shard `rank` of `size` of parameter `param`, taken from its full tensor. Must work on
// any dtype (it is also applied to a tensor of element indices to invert the split).
using SplitFn = std::function<at::Tensor(const std::string& param, const at::Tensor& full, int rank, int size)>;

struct Piece {
  std::string tensor;                  // global name: "h.0.mlp.c_fc.weight" or "h.0.mlp.c_fc.weight#exp_avg"
  std::string param;                   // the parameter whose tensor-parallel split it follows
  std::vector<int64_t> global_shape;   // of the unsplit tensor
  std::vector<int64_t> shard_shape;    // of the tensor-parallel shard (== global_shape when not split)
  int tp_rank = 0, tp_size = 1;        // tp_size 1: not split
  int64_t offset = 0;                  // first element of the piece in the flattened shard
  at::Tensor data;                     // 1-D, CPU
};

struct PieceRecord {
  std::string file, key, tensor, param, dtype, checksum;
  std::vector<int64_t> global_shape, shard_shape;
  int tp_rank = 0, tp_size = 1;
  int64_t offset = 0, numel = 0;
};

nlohmann::json records_to_json(const std::vector<PieceRecord>& records);
std::vector<PieceRecord> records_from_json(const nlohmann::json& j);

std::string step_dir_name(int64_t step);  // step_00000042
std::string piece_file_name(int rank);   // rank-00003.safetensors: the file of one rank's pieces
std::string temp_checkpoint_dir(const std::string& run_dir, int64_t step);
std::string final_checkpoint_dir(const std::string& run_dir, int64_t step);

// FNV-1a over the bytes: catches flipped or zeroed data that still parses.
std::string checksum_of(const at::Tensor& t);

// `faults` below (checkpoint/faults.h) are what tests inject; the defaults inject nothing.

// Removes the temporary directory of a failed save (the partial files of every rank); never throws.
void discard_checkpoint_attempt(const std::string& run_dir, int64_t step, const StorageFaults& faults = {});

// Phase 1, on every rank holding pieces (may run on a background thread): writes them into one safetensors
// file in `tmp_dir` and syncs it. Returns their records (file names relative to the checkpoint directory).
std::vector<PieceRecord> write_pieces(const std::string& tmp_dir, int rank, const std::vector<Piece>& pieces,
                                     const StorageFaults& faults = {});

// Phase 2, on one rank once every rank's file is on disk: writes manifest.json with the records and `info`,
// removes files of earlier attempts, syncs, renames the directory; then deletes all but the newest
// `keep_last` checkpoints (0 keeps all). Returns the final directory. A failure before the rename (a full
// disk) removes the temporary directory and throws Error naming the file and the errno; a failed rename keeps
// any earlier checkpoint of this step and leaves the new one, complete, in the temporary directory.
// `source_dir`: where the files are, when not the step's temporary directory (a site's staged copy).
std::string commit_checkpoint(const std::string& run_dir, int64_t step, const std::vector<PieceRecord>& records,
                              const nlohmann::json& info, int keep_last, const StorageFaults& faults = {},
                              const std::string& source_dir = "");

// The newest complete checkpoint of a run (a step_N directory with a manifest), if any.
std::optional<std::string> latest_checkpoint(const std::string& run_dir);
// For an error about the broken checkpoint `broken` of `run_dir`: the newest older checkpoint that verifies
// (sizes and checksums), and the commands that make --resume take it, moving rather than deleting; or that
// none is left.
std::string intact_checkpoint_hint(const std::string& run_dir, const std::string& broken);
// A checkpoint directory given directly, or a run directory: its newest checkpoint. Throws UsageError.
std::string resolve_checkpoint(const std::string& path);

// Reads a checkpoint. The constructor checks the manifest; reads check sizes and checksums. Every problem is a
// UsageError naming the file.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& dir);
  ~CheckpointReader();
  const std::string& dir() const { return dir_; }
  int64_t step() const { return step_; }
  const nlohmann::json& info() const { return info_; }
  std::vector<std::string> tensors() const;
  bool has(const std::string& tensor) const { return tensors_.count(tensor) > 0; }
  std::vector<int64_t> global_shape(const std::string& tensor) const;
  std::string dtype(const std::string& tensor) const;
  // How the tensor is stored: "tp=2, 4 pieces".
  std::string describe(const std::string& tensor) const;
  std::vector<std::string> files() const;
  int64_t stored_bytes() const;
  // Checks the files against the manifest without loading the model: every file opens and is as long as its
  // header says, and holds every listed piece with its recorded size; with `checksums`, every piece is also
  // read and compared with its checksum (reads the whole checkpoint). Throws UsageError naming the file.
  // Returns the number of pieces checked.
  int64_t verify(bool checksums);
  // The whole tensor, rebuilt from its pieces (only the files holding them are read).
  at::Tensor read_full(const std::string& tensor, const SplitFn& split);

 private:
  struct Reader;
  std::string dir_;
  int64_t step_ = 0;
  nlohmann::json info_;
  std::map<std::string, std::vector<PieceRecord>> tensors_;
  std::map<std::string, std::unique_ptr<Reader>> open_;
};

}  // namespace crosstrain::checkpoint
