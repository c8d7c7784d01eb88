// Weights in and out of crosstrain: a Hugging Face model directory (config.json + model.safetensors, or shards
// listed in model.safetensors.index.json) or a crosstrain checkpoint, read tensor by tensor under crosstrain's
// names and layout; the Hugging Face export; and model.init_from, which copies every rank's shards of the
// weights into a freshly built model of any layout. Names, layouts and config keys: hf_layout.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "crosstrain/models/gpt_config.h"

namespace crosstrain::train {

// Whole parameters of a model, whatever stored them.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // The model the weights belong to (config.json, or the checkpoint's recipe).
  virtual const models::GPTConfig& config() const = 0;
  // "Hugging Face gpt2 directory 'DIR' (model.safetensors)" / "crosstrain checkpoint 'DIR' (step 40)".
  virtual std::string describe() const = 0;
  // Throws UsageError naming every parameter of config() that is missing or has another shape, and tensors
  // that are neither parameters nor known buffers. Reads headers only.
  virtual void check() const = 0;
  // Crosstrain's layout ([out, in] weights), the stored dtype; `name` a parameter of config().
  virtual at::Tensor read(const std::string& name) = 0;
  // Bytes read() returns, without reading.
  virtual int64_t bytes(const std::string& name) const = 0;
  // Things the user should know (an approximate activation in the source model), one line each.
  virtual std::vector<std::string> warnings() const { return {}; }
};

// A directory with config.json is read as Hugging Face's layout; anything else as a crosstrain checkpoint
// directory or run directory (its newest checkpoint). Throws UsageError naming the path and what is wrong.
std::unique_ptr<WeightSource> open_weights(const std::string& path);
// The model of a Hugging Face directory (config.json only), for tools.
models::GPTConfig hf_model_config(const std::string& dir);

struct HfExportResult {
  std::vector<std::string> files;  // safetensors files written, in order
  int64_t tensors = 0, parameters = 0;
  int64_t bytes = 0;               // of tensor data (the index's metadata.total_size)
};
// Writes `dir`: config.json, and model.safetensors or, past `max_shard_bytes`, model-0000i-of-0000N.safetensors
// with model.safetensors.index.json. Every file carries metadata {"format": "pt"}. Written into "<dir>.tmp" and
// renamed, so `dir` is complete or absent; an existing `dir` is a UsageError (nothing is overwritten).
HfExportResult write_hf_directory(const std::string& dir, WeightSource& source, int64_t max_shard_bytes);

// model.init_from's checks, from config.json and the files' headers only: the source against `recipe` (a
// UsageError lists each differing field with both values and the --set that fixes it), then its tensors (missing,
// misshapen, unknown). check_config runs it before a launcher starts any rank.
void check_initial_weights(const std::string& path, const models::GPTConfig& recipe);

struct InitialWeights {
  std::string line;                   // where the weights came from, for the run's header
  std::vector<std::string> warnings;  // the source's (WeightSource::warnings)
};
// model.init_from for one rank: check_initial_weights, then copies this rank's tensor-parallel shard of every
// parameter it holds (`shards`, by plain name) from the whole tensor.
InitialWeights load_initial_weights(const std::string& path, const models::GPTConfig& recipe,
                                  const std::map<std::string, at::Tensor>& shards, int tp_rank, int tp_size);

}  // namespace crosstrain::train
