// `crosstrain ckpt info|export`: look into a distributed checkpoint and turn it into one safetensors file.
#pragma once

#include <string>

namespace crosstrain::apps {

// Prints a summary of the checkpoint (a checkpoint directory, or a run directory: its newest one) after
// checking its files' sizes against the manifest; with `verify`, also every piece's checksum (reads it all).
// A broken checkpoint is a UsageError naming the file (and, for a run directory, its newest intact one).
int ckpt_info(const std::string& path, bool list_tensors, bool verify);
// Writes every parameter, whole and under its plain name, into one safetensors file (atomically: a temporary
// name, then a rename). With `optimizer`, also the Adam moments as "NAME#exp_avg" and "NAME#exp_avg_sq".
int ckpt_export(const std::string& path, const std::string& output, bool optimizer);
// `--format hf`: writes a Hugging Face model directory (config.json + model.safetensors, or shards of at most
// `max_shard_size` with model.safetensors.index.json; interop/hf/checkpoint.h) from a checkpoint, a run directory
// or another Hugging Face directory.
int ckpt_export_hf(const std::string& path, const std::string& out_dir, const std::string& max_shard_size);

}  // namespace crosstrain::apps
