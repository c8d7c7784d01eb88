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

constexpr int kFormatVersion = 1;

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

}  // namespace

std::string save_checkpoint(const std::string& run_dir, const CheckpointState& state, torch::nn::Module& model,
                            torch::optim::Optimizer& optimizer) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  fs::create_directories(root);
  const fs::path final_dir = root / step_name(state.step);
  const fs::path tmp = root / (step_name(state.step) + ".tmp");
  fs::remove_all(tmp);
  fs::create_directories(tmp);

  std::vector<checkpoint::NamedTensor> tensors;
  nlohmann::json sums = nlohmann::json::object();
  for (const auto& p : model.named_parameters()) {
    tensors.push_back({p.key(), p.value().detach()});
    sums[p.key()] = checksum(p.value().detach());
  }
  checkpoint::write_safetensors((tmp / "model.safetensors").string(), tensors, {{"format", "pt"}});
  {
    torch::serialize::OutputArchive archive;
    optimizer.save(archive);
    archive.save_to((tmp / "optimizer.pt").string());
  }
  nlohmann::json meta = {{"format_version", kFormatVersion},
                         {"step", state.step},
                         {"sampler", {{"seed", state.sampler.seed}, {"next_step", state.sampler.next_step}}},
                         {"config", state.config_toml},
                         {"checksums", sums}};
  {
    std::ofstream out(tmp / "state.json");
    out << meta.dump(2) << "\n";
    if (!out) throw Error("cannot write checkpoint state in '" + tmp.string() + "'");
  }
  for (const char* f : {"model.safetensors", "optimizer.pt", "state.json"}) fsync_path(tmp / f);
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

CheckpointState load_checkpoint(const std::string& dir, torch::nn::Module& model, torch::optim::Optimizer& optimizer) {
  const fs::path d(dir);
  for (const char* f : {"model.safetensors", "optimizer.pt", "state.json"})
    if (!fs::exists(d / f)) throw UsageError("checkpoint '" + dir + "' is incomplete: " + f + " is missing");
  nlohmann::json meta;
  try {
    std::ifstream in(d / "state.json");
    meta = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError("checkpoint file '" + (d / "state.json").string() + "' is corrupt: " + e.what());
  }
  if (meta.value("format_version", 0) != kFormatVersion)
    throw UsageError("checkpoint '" + dir + "' has format version " + std::to_string(meta.value("format_version", 0)) +
                     ", this build reads " + std::to_string(kFormatVersion));
  auto file = checkpoint::read_safetensors((d / "model.safetensors").string());
  const std::string weights = (d / "model.safetensors").string();
  auto params = model.named_parameters();
  for (const auto& p : params) {
    auto it = file.tensors.find(p.key());
    if (it == file.tensors.end())
      throw UsageError("checkpoint file '" + weights + "' has no tensor '" + p.key() + "': is it from another model?");
    if (it->second.sizes() != p.value().sizes())
      throw UsageError("checkpoint file '" + weights + "': tensor '" + p.key() + "' has shape " +
                       c10::str(it->second.sizes()) + " but the model needs " + c10::str(p.value().sizes()) +
                       " (another model configuration?)");
    if (meta["checksums"].value(p.key(), "") != checksum(it->second))
      throw UsageError("checkpoint file '" + weights + "': tensor '" + p.key() + "' does not match its checksum (corrupt)");
  }
  if (file.tensors.size() != params.size())
    throw UsageError("checkpoint file '" + weights + "' has " + std::to_string(file.tensors.size()) +
                     " tensors but the model has " + std::to_string(params.size()) + " (another model?)");
  try {
    torch::serialize::InputArchive archive;
    archive.load_from((d / "optimizer.pt").string());
    optimizer.load(archive);
  } catch (const c10::Error& e) {
    std::string what = e.what_without_backtrace();
    throw UsageError("checkpoint file '" + (d / "optimizer.pt").string() + "' is corrupt or from another model: " +
                     what.substr(0, what.find('\n')));
  }
  {
    torch::NoGradGuard no_grad;
    for (auto& p : params) p.value().copy_(file.tensors[p.key()]);
  }
  CheckpointState state;
  state.step = meta.at("step").get<int64_t>();
  state.sampler.seed = meta.at("sampler").at("seed").get<uint64_t>();
  state.sampler.next_step = meta.at("sampler").at("next_step").get<int64_t>();
  state.config_toml = meta.value("config", "");
  return state;
}

}  // namespace crosstrain::train
