#include "crosstrain/train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iomanip>
#include <sstream>

#include "crosstrain/checkpoint/safetensors.h"
#include "crosstrain/core/error.h"

namespace crosstrain::train {
namespace fs = std::filesystem;

namespace {

constexpr int kFormatVersion = 2;

void fsync_path(const fs::path& p) {
  int fd = open(p.c_str(), O_RDONLY);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}

// FNV-1a over the tensor's bytes: catches flipped or zeroed data that still parses.
std::string checksum(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  uint64_t h = 1469598103934665603ULL;
  for (int64_t i = 0, n = c.numel() * static_cast<int64_t>(c.element_size()); i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ULL;
  }
  std::ostringstream out;
  out << std::hex << std::setw(16) << std::setfill('0') << h;
  return out.str();
}

std::string step_name(int64_t step) {
  std::ostringstream out;
  out << "step_" << std::setw(8) << std::setfill('0') << step;
  return out.str();
}

fs::path temp_dir(const std::string& run_dir, int64_t step) {
  return fs::path(run_dir) / "checkpoints" / (step_name(step) + ".tmp");
}

}  // namespace

std::string shard_name(int pp_index, int tp_index) {
  return "pp" + std::to_string(pp_index) + "-tp" + std::to_string(tp_index);
}

void write_checkpoint_shard(const std::string& run_dir, int64_t step, const std::string& shard,
                            const std::map<std::string, torch::Tensor>& parameters, torch::optim::Optimizer& optimizer) {
  const fs::path tmp = temp_dir(run_dir, step);
  fs::create_directories(tmp);
  std::vector<checkpoint::NamedTensor> tensors;
  std::map<std::string, std::string> metadata{{"format", "pt"}};
  for (const auto& [name, p] : parameters) {
    tensors.push_back({name, p.detach()});
    metadata["checksum." + name] = checksum(p.detach());
  }
  const fs::path weights = tmp / ("model-" + shard + ".safetensors");
  const fs::path optim = tmp / ("optimizer-" + shard + ".pt");
  checkpoint::write_safetensors(weights.string(), tensors, metadata);
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  archive.save_to(optim.string());
  fsync_path(weights);
  fsync_path(optim);
}

std::string commit_checkpoint(const std::string& run_dir, const CheckpointState& state) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  const fs::path tmp = temp_dir(run_dir, state.step);
  const fs::path final_dir = root / step_name(state.step);
  nlohmann::json meta = {{"format_version", kFormatVersion},
                         {"step", state.step},
                         {"sampler", {{"seed", state.sampler.seed}, {"next_step", state.sampler.next_step}}},
                         {"layout", {{"pp", state.pp}, {"tp", state.tp}}},
                         {"config", state.config_toml}};
  {
    std::ofstream out(tmp / "state.json");
    out << meta.dump(2) << "\n";
    if (!out) throw Error("cannot write checkpoint state in '" + tmp.string() + "'");
  }
  fsync_path(tmp / "state.json");
  fsync_path(tmp);
  // The rename is the commit point: before it the checkpoint is invisible, after it complete.
  fs::remove_all(final_dir);
  fs::rename(tmp, final_dir);
  fsync_path(root);
  return final_dir.string();
}

std::optional<std::string> latest_checkpoint(const std::string& run_dir) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return std::nullopt;
  std::optional<std::string> best;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.rfind("step_", 0) != 0 || name.find(".tmp") != std::string::npos) continue;
    if (!best || name > fs::path(*best).filename().string()) best = entry.path().string();
  }
  return best;
}

CheckpointState read_checkpoint_state(const std::string& dir, int pp, int tp) {
  const fs::path file = fs::path(dir) / "state.json";
  if (!fs::exists(file)) throw UsageError("checkpoint '" + dir + "' is incomplete: state.json is missing");
  nlohmann::json meta;
  try {
    std::ifstream in(file);
    meta = nlohmann::json::parse(in);
    CheckpointState s;
    if (meta.value("format_version", 0) != kFormatVersion)
      throw UsageError("checkpoint '" + dir + "' has format version " + std::to_string(meta.value("format_version", 0)) +
                       ", this build reads " + std::to_string(kFormatVersion));
    s.step = meta.at("step").get<int64_t>();
    s.sampler.seed = meta.at("sampler").at("seed").get<uint64_t>();
    s.sampler.next_step = meta.at("sampler").at("next_step").get<int64_t>();
    s.pp = meta.at("layout").at("pp").get<int>();
    s.tp = meta.at("layout").at("tp").get<int>();
    s.config_toml = meta.value("config", "");
    if (s.pp != pp || s.tp != tp)
      throw UsageError("checkpoint '" + dir + "' was written with pp=" + std::to_string(s.pp) + " tp=" +
                       std::to_string(s.tp) + " but this run uses pp=" + std::to_string(pp) + " tp=" +
                       std::to_string(tp) + "; resume with the same parallel.pp and parallel.tp");
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw UsageError("checkpoint file '" + file.string() + "' is corrupt: " + e.what());
  }
}

void load_checkpoint_shard(const std::string& dir, const std::string& shard,
                           const std::map<std::string, torch::Tensor>& parameters, torch::optim::Optimizer& optimizer) {
  const fs::path d(dir);
  const std::string weights = (d / ("model-" + shard + ".safetensors")).string();
  const std::string optim = (d / ("optimizer-" + shard + ".pt")).string();
  for (const auto& f : {weights, optim})
    if (!fs::exists(f)) throw UsageError("checkpoint '" + dir + "' is incomplete: " + f + " is missing");
  auto file = checkpoint::read_safetensors(weights);
  for (const auto& [name, p] : parameters) {
    auto it = file.tensors.find(name);
    if (it == file.tensors.end())
      throw UsageError("checkpoint file '" + weights + "' has no tensor '" + name + "': is it from another model?");
    if (it->second.sizes() != p.sizes())
      throw UsageError("checkpoint file '" + weights + "': tensor '" + name + "' has shape " +
                       c10::str(it->second.sizes()) + " but the model needs " + c10::str(p.sizes()) +
                       " (another model configuration?)");
    auto sum = file.metadata.find("checksum." + name);
    if (sum == file.metadata.end() || sum->second != checksum(it->second))
      throw UsageError("checkpoint file '" + weights + "': tensor '" + name + "' does not match its checksum (corrupt)");
  }
  if (file.tensors.size() != parameters.size())
    throw UsageError("checkpoint file '" + weights + "' has " + std::to_string(file.tensors.size()) +
                     " tensors but the model has " + std::to_string(parameters.size()) + " (another model?)");
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(optim);
    optimizer.load(archive);
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    throw UsageError("checkpoint file '" + optim + "' is corrupt or from another model: " +
                     what.substr(0, what.find('\n')));
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, p] : parameters) const_cast<torch::Tensor&>(p).copy_(file.tensors[name]);
}

}  // namespace crosstrain::train
