#include "ckpt_cmd.h"

#include <cstdio>
#include <filesystem>
#include <optional>

#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/checkpoint/safetensors.h"
#include "crosstrain/core/error.h"
#include "crosstrain/models/gpt_parallel.h"
#include "crosstrain/train/config.h"
#include "crosstrain/jobs/dlrm/trainer.h"
#include "crosstrain/interop/hf/checkpoint.h"
#include "crosstrain/interop/hf/layout.h"

namespace crosstrain::apps {
namespace fs = std::filesystem;

namespace {

bool is_parameter(const std::string& tensor) { return tensor.find('#') == std::string::npos; }

// The model config saved with the checkpoint gives the tensor-parallel split of each parameter.
checkpoint::SplitFn split_for(const checkpoint::CheckpointReader& reader) {
  const std::string text = reader.info().value("config", "");
  if (text.empty()) throw UsageError("checkpoint '" + reader.dir() + "' does not record its config (manifest.json)");
  models::GPTConfig model = train::parse_config(text, reader.dir() + "/manifest.json").model;
  if (model.arch == models::ModelArch::Dlrm) return train::dlrm_checkpoint_split();  // column-wise tables split along dim 1
  return [model](const std::string& name, const at::Tensor& full, int rank, int size) {
    return models::shard_of(name, full, model, rank, size);
  };
}

// A crosstrain checkpoint (or run directory) saved by a DLRM run; false for anything else, a Hugging Face
// directory included.
bool is_dlrm_checkpoint(const std::string& path) {
  std::string dir;
  try {
    dir = checkpoint::resolve_checkpoint(path);
  } catch (const UsageError&) {
    return false;
  }
  if (!fs::exists(fs::path(dir) / "manifest.json")) return false;
  return checkpoint::CheckpointReader(dir).info().value("model", "") == models::to_string(models::ModelArch::Dlrm);
}

}  // namespace

int ckpt_info(const std::string& path, bool list_tensors, bool verify) {
  const std::string dir = checkpoint::resolve_checkpoint(path);
  const bool run_dir = dir != path;
  int64_t pieces = 0;
  // Checked before anything is printed, so a broken checkpoint never shows a healthy-looking summary.
  std::optional<checkpoint::CheckpointReader> opened;
  try {
    opened.emplace(dir);
    pieces = opened->verify(verify);
  } catch (const UsageError& e) {
    if (!run_dir) throw;
    throw UsageError(std::string(e.what()) + "; " + checkpoint::intact_checkpoint_hint(path, dir));
  }
  checkpoint::CheckpointReader& reader = *opened;
  const auto& info = reader.info();
  int64_t params = 0, param_tensors = 0, state_tensors = 0;
  for (const auto& t : reader.tensors()) {
    if (!is_parameter(t)) {
      ++state_tensors;
      continue;
    }
    ++param_tensors;
    int64_t n = 1;
    for (auto d : reader.global_shape(t)) n *= d;
    params += n;
  }
  std::printf("checkpoint %s\n", reader.dir().c_str());
  std::printf("  step            %lld (optimizer step %lld)\n", static_cast<long long>(reader.step()),
              static_cast<long long>(info.value("optimizer_step", reader.step())));
  if (info.contains("layout")) {
    const auto& l = info["layout"];
    std::printf("  saved by        dp=%d pp=%d tp=%d zero=%d\n", l.value("dp", 1), l.value("pp", 1), l.value("tp", 1),
                l.value("zero", 0));
  }
  if (info.contains("sampler"))
    std::printf("  data position   next step %lld (sampler seed %llu)\n",
                static_cast<long long>(info["sampler"].value("next_step", 0LL)),
                static_cast<unsigned long long>(info["sampler"].value("seed", 0ULL)));
  std::printf("  parameters      %lld in %lld tensors (+ optimizer state: %lld tensors)\n", static_cast<long long>(params),
              static_cast<long long>(param_tensors), static_cast<long long>(state_tensors));
  std::printf("  files           %zu shard files + manifest.json, %.2f MiB\n", reader.files().size(),
              static_cast<double>(reader.stored_bytes()) / (1 << 20));
  if (verify)
    std::printf("  integrity       verified: sizes and checksums of %lld pieces\n", static_cast<long long>(pieces));
  else
    std::printf("  integrity       sizes of %lld pieces checked; checksums NOT verified (add --verify to read "
                "and check every piece)\n", static_cast<long long>(pieces));
  if (list_tensors) {
    std::printf("  %-34s %-16s %-5s %s\n", "tensor", "shape", "dtype", "stored as");
    for (const auto& t : reader.tensors())
      std::printf("  %-34s %-16s %-5s %s\n", t.c_str(), c10::str(c10::IntArrayRef(reader.global_shape(t))).c_str(),
                  reader.dtype(t).c_str(), reader.describe(t).c_str());
  }
  return 0;
}

int ckpt_export(const std::string& path, const std::string& output, bool optimizer) {
  checkpoint::CheckpointReader reader(checkpoint::resolve_checkpoint(path));
  auto split = split_for(reader);
  std::vector<checkpoint::NamedTensor> tensors;
  int64_t params = 0;
  for (const auto& t : reader.tensors()) {
    if (!optimizer && !is_parameter(t)) continue;
    at::Tensor full = reader.read_full(t, split);
    if (is_parameter(t)) params += full.numel();
    tensors.push_back({t, full});
  }
  const std::string tmp = output + ".tmp";
  checkpoint::write_safetensors(tmp, tensors,
                                {{"format", "pt"}, {"step", std::to_string(reader.step())}, {"source", reader.dir()}});
  fs::rename(tmp, output);
  std::printf("wrote %s: %zu tensors, %lld parameters, step %lld\n", output.c_str(), tensors.size(),
              static_cast<long long>(params), static_cast<long long>(reader.step()));
  return 0;
}

int ckpt_export_hf(const std::string& path, const std::string& out_dir, const std::string& max_shard_size) {
  const int64_t max_bytes = train::hf::parse_size(max_shard_size);
  if (is_dlrm_checkpoint(path))
    throw UsageError("'" + path + "' holds a DLRM model, which has no Hugging Face layout: export it as one safetensors "
                     "file with `crosstrain ckpt export " + path + " --out dlrm.safetensors`");
  auto source = train::open_weights(path);
  for (const auto& warning : source->warnings()) std::fprintf(stderr, "crosstrain: warning: %s\n", warning.c_str());
  const train::HfExportResult r = train::write_hf_directory(out_dir, *source, max_bytes);
  std::printf("wrote %s: config.json + %zu safetensors file%s (%s), %lld tensors, %lld parameters, %.2f MiB, from %s\n",
              out_dir.c_str(), r.files.size(), r.files.size() == 1 ? "" : "s + model.safetensors.index.json",
              source->config().is_llama() ? "LlamaForCausalLM" : "GPT2LMHeadModel", static_cast<long long>(r.tensors),
              static_cast<long long>(r.parameters), static_cast<double>(r.bytes) / (1 << 20), source->describe().c_str());
  return 0;
}

}  // namespace crosstrain::apps
