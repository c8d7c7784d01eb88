#include "crosstrain/interop/hf/checkpoint.h"

#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/checkpoint/safetensors.h"
#include "crosstrain/core/error.h"
#include "crosstrain/core/names.h"
#include "crosstrain/models/gpt_init.h"
#include "crosstrain/models/gpt_parallel.h"
#include "crosstrain/models/parallel_plan.h"
#include "crosstrain/train/config.h"
#include "crosstrain/interop/hf/layout.h"

namespace crosstrain::train {
namespace fs = std::filesystem;

namespace {

std::string torch_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    case at::kDouble: return "float64";
    default: throw Error(std::string("no Hugging Face dtype for ") + c10::toString(t));
  }
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UsageError("cannot open '" + path + "'");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError("'" + path + "' is not valid JSON (" + e.what() + ")");
  }
}

std::string join(const std::vector<std::string>& items, size_t most = 8) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < most; ++i) out += (i ? ", " : "") + items[i];
  if (items.size() > most) out += ", ... (" + std::to_string(items.size()) + " in all)";
  return out;
}

std::string shape_text(const std::vector<int64_t>& shape) { return c10::str(c10::IntArrayRef(shape)); }

// One line (the program prints an error's first line): "missing tensors: a, b; wrong shapes: ...".
std::string tensor_problems(const std::vector<std::string>& missing, const std::vector<std::string>& misshapen,
                            const std::vector<std::string>& extra) {
  std::vector<std::string> parts;
  if (!missing.empty()) parts.push_back("missing tensors: " + join(missing));
  if (!misshapen.empty()) parts.push_back("wrong shapes: " + join(misshapen, 4));
  if (!extra.empty()) parts.push_back("tensors this model does not have: " + join(extra));
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : "; ") + p;
  return out;
}

// A Hugging Face model directory: config.json, and model.safetensors or the shards its index lists.
class HfDirectory : public WeightSource {
 public:
  explicit HfDirectory(const std::string& dir) : dir_(dir) {
    hf_ = hf::config_from_hf(read_json((fs::path(dir) / "config.json").string()), "'" + dir + "/config.json'");
    open_files();
    for (const auto& m : hf::tensor_map(hf_.model)) map_[m.name] = m;
  }
  const models::GPTConfig& config() const override { return hf_.model; }
  std::vector<std::string> warnings() const override { return hf_.warnings; }
  std::string describe() const override {
    return "Hugging Face " + std::string(hf_.model.is_llama() ? "llama" : "gpt2") + " directory '" + dir_ + "' (" +
           (readers_.size() == 1 ? readers_.begin()->first : std::to_string(readers_.size()) + " shards") + ")";
  }
  void check() const override;
  at::Tensor read(const std::string& name) override {
    const Stored s = stored(name).value();
    at::Tensor t = readers_.at(file_.at(s.hf_name))->read(s.hf_name);
    return s.transposed ? t.t().contiguous() : t;
  }
  int64_t bytes(const std::string& name) const override {
    const Stored s = stored(name).value();
    const auto& reader = *readers_.at(file_.at(s.hf_name));
    return reader.numel(s.hf_name) * static_cast<int64_t>(c10::elementSize(reader.dtype(s.hf_name)));
  }

 private:
  struct Stored {
    std::string hf_name;  // as in the file
    bool transposed = false;
    std::vector<int64_t> hf_shape;  // expected
  };
  void open_files();
  // Where the file keeps a parameter; GPT-2's tied head is the embedding (lm_head.weight is then often absent).
  std::optional<Stored> stored(const std::string& name) const {
    const bool tied = !hf_.model.is_llama() && hf_.tied_head && name == "lm_head.weight";
    const hf::TensorMapping& m = map_.at(tied ? "wte.weight" : name);
    for (const auto& candidate : hf::hf_name_candidates(hf_.model, m.hf_name))
      if (file_.count(candidate)) return Stored{candidate, m.transposed, m.hf_shape};
    return std::nullopt;
  }

  std::string dir_;
  hf::HfConfig hf_;
  std::map<std::string, hf::TensorMapping> map_;  // by crosstrain name
  std::map<std::string, std::string> file_;       // Hugging Face name -> file
  std::map<std::string, std::unique_ptr<checkpoint::SafetensorsReader>> readers_;
};

void HfDirectory::open_files() {
  const fs::path dir(dir_), index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const nlohmann::json j = read_json(index.string());
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      throw UsageError("'" + index.string() + "' has no \"weight_map\" object");
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string())
        throw UsageError("'" + index.string() + "': the weight_map entry of '" + name.substr(0, 200) + "' is not a file name");
      const std::string f = file.get<std::string>();
      // Shards lie beside the index: a path in the map could read any file the process may read.
      if (const std::string why = file_name_error(f); !why.empty())
        throw UsageError("'" + index.string() + "': the weight_map entry of '" + name.substr(0, 200) + "': " + why);
      auto& reader = readers_[f];
      if (!reader) reader = std::make_unique<checkpoint::SafetensorsReader>((dir / f).string());
      if (!reader->has(name))
        throw UsageError("'" + index.string() + "' puts '" + name + "' in " + f + ", which does not hold it");
      file_[name] = f;
    }
    return;
  }
  if (!fs::exists(dir / "model.safetensors"))
    throw UsageError("'" + dir_ + "' has config.json but neither model.safetensors nor model.safetensors.index.json "
                     "(crosstrain reads safetensors only; convert a pytorch_model.bin with transformers first)");
  readers_["model.safetensors"] = std::make_unique<checkpoint::SafetensorsReader>((dir / "model.safetensors").string());
  for (const auto& name : readers_["model.safetensors"]->names()) file_[name] = "model.safetensors";
}

void HfDirectory::check() const {
  std::vector<std::string> missing, misshapen, extra;
  std::set<std::string> used;
  for (const auto& [name, m] : map_) {
    auto s = stored(name);
    if (!s) {
      missing.push_back(m.hf_name);
      continue;
    }
    used.insert(s->hf_name);
    const auto shape = readers_.at(file_.at(s->hf_name))->shape(s->hf_name);
    if (shape != s->hf_shape)
      misshapen.push_back(s->hf_name + " is " + shape_text(shape) + ", config.json needs " + shape_text(s->hf_shape));
  }
  for (const auto& [name, file] : file_)
    if (!used.count(name) && !hf::ignorable_hf_tensor(hf_.model, hf_.tied_head, name)) extra.push_back(name);
  const std::string problems = tensor_problems(missing, misshapen, extra);
  if (!problems.empty())
    throw UsageError("'" + dir_ + "' does not hold the weights its config.json describes: " + problems);
}

int64_t dtype_bytes(const std::string& name) {
  if (name == "F64" || name == "I64") return 8;
  if (name == "BF16" || name == "F16") return 2;
  return 4;
}

// A crosstrain checkpoint (or a run directory's newest), whatever layout wrote it. A fine-tuning run's checkpoint
// holds only what it trained: its frozen weights are read from the run's model.init_from (or are the seed's
// initial values, without one), and LoRA adapters are merged into their projections (W + s B A), so the source
// is the whole fine-tuned model, without adapters.
class CheckpointSource : public WeightSource {
 public:
  explicit CheckpointSource(const std::string& path) : reader_(checkpoint::resolve_checkpoint(path)) {
    const std::string text = reader_.info().value("config", "");
    if (text.empty()) throw UsageError("checkpoint '" + reader_.dir() + "' does not record its config (manifest.json)");
    const Config run = parse_config(text, reader_.dir() + "/manifest.json");
    stored_plan_ = std::make_shared<const models::ParallelPlan>(run.model);
    config_ = run.model;
    config_.lora_rank = 0;  // merged
    plan_ = std::make_shared<const models::ParallelPlan>(config_);
    seed_ = run.run.seed;
    lora_ = run.model.lora_rank > 0;
    scale_ = run.model.lora_scale();
    frozen_ = models::frozen_parameters(*stored_plan_, run.model, run.train.freeze);
    if (!run.model_init_from.empty() && !frozen_.empty()) base_ = open_weights(run.model_init_from);
  }
  const models::GPTConfig& config() const override { return config_; }
  std::string describe() const override {
    return "crosstrain checkpoint '" + reader_.dir() + "' (step " + std::to_string(reader_.step()) + ")";
  }
  void check() const override {
    std::vector<std::string> missing, misshapen, extra;
    for (const auto& p : stored_plan_->parameters()) {
      if (!reader_.has(p.name)) {
        // A fine-tune's frozen weight comes from init_from or the seed; anything else missing is damage.
        if (!frozen_.count(p.name)) missing.push_back(p.name);
        continue;
      }
      if (reader_.global_shape(p.name) != p.shape)
        misshapen.push_back(p.name + " is " + shape_text(reader_.global_shape(p.name)) + ", its config needs " +
                            shape_text(p.shape));
    }
    for (const auto& t : reader_.tensors())
      if (t.find('#') == std::string::npos && !stored_plan_->contains(t)) extra.push_back(t);
    const std::string problems = tensor_problems(missing, misshapen, extra);
    if (!problems.empty())
      throw UsageError("checkpoint '" + reader_.dir() + "' does not match the model its manifest records: " + problems);
    if (base_) base_->check();
  }
  at::Tensor read(const std::string& name) override {
    at::Tensor w = stored(name);
    const std::string adapter = name.substr(0, name.rfind('.'));  // "h.0.attn.q_proj"
    const bool weight = name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
    if (lora_ && weight && stored_plan_->contains(adapter + ".lora_A")) {
      torch::NoGradGuard no_grad;
      const at::Tensor a = stored(adapter + ".lora_A").to(at::kFloat), b = stored(adapter + ".lora_B").to(at::kFloat);
      w = (w.to(at::kFloat) + scale_ * b.mm(a)).to(w.scalar_type());
    }
    return w;
  }
  int64_t bytes(const std::string& name) const override {
    if (!reader_.has(name)) {
      int64_t n = 4;
      for (int64_t d : plan_->at(name).shape) n *= d;
      return n;
    }
    int64_t n = dtype_bytes(reader_.dtype(name));
    for (int64_t d : reader_.global_shape(name)) n *= d;
    return n;
  }

 private:
  // A tensor as the run left it: saved, or (frozen) from init_from or the seed.
  at::Tensor stored(const std::string& name) {
    if (reader_.has(name)) {
      auto plan = stored_plan_;
      return reader_.read_full(name, [plan](const std::string& n, const at::Tensor& full, int rank, int size) {
        return models::shard_of(*plan, n, full, rank, size);
      });
    }
    if (!frozen_.count(name))
      throw UsageError("checkpoint '" + reader_.dir() + "' has no tensor '" + name + "', and the run did not freeze it");
    if (base_) return base_->read(name);
    return models::initial_shard(stored_plan_->at(name), seed_, 0, 1);
  }

  mutable checkpoint::CheckpointReader reader_;
  models::GPTConfig config_;  // the model without adapters
  std::shared_ptr<const models::ParallelPlan> plan_, stored_plan_;
  std::set<std::string> frozen_;         // train.freeze of the run (with LoRA: all but the adapters)
  std::unique_ptr<WeightSource> base_;  // the run's model.init_from, when it froze weights
  uint64_t seed_ = 0;
  bool lora_ = false;
  double scale_ = 1.0;
};

void write_index(const fs::path& path, const nlohmann::json& weight_map, int64_t total) {
  nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
  std::ofstream out(path);
  out << index.dump(2) << "\n";
  if (!out) throw Error("cannot write '" + path.string() + "'");
}

}  // namespace

std::unique_ptr<WeightSource> open_weights(const std::string& path) {
  if (!fs::exists(path)) throw UsageError("'" + path + "' does not exist");
  if (fs::is_directory(path) && fs::exists(fs::path(path) / "config.json")) return std::make_unique<HfDirectory>(path);
  return std::make_unique<CheckpointSource>(path);
}

models::GPTConfig hf_model_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  return hf::config_from_hf(read_json(path), "'" + path + "'").model;
}

HfExportResult write_hf_directory(const std::string& dir, WeightSource& source, int64_t max_shard_bytes) {
  if (fs::exists(dir)) throw UsageError("'" + dir + "' already exists; remove it or choose another --out");
  source.check();
  const fs::path tmp = dir + ".tmp";
  fs::remove_all(tmp);
  fs::create_directories(tmp);
  const auto map = hf::tensor_map(source.config());
  std::vector<int64_t> sizes;
  for (const auto& m : map) sizes.push_back(source.bytes(m.name));
  const auto shards = hf::plan_shards(sizes, max_shard_bytes);
  HfExportResult result;
  nlohmann::json weight_map = nlohmann::json::object();
  at::ScalarType dtype = at::kFloat;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = hf::shard_file_name(s + 1, shards.size());
    std::vector<checkpoint::NamedTensor> tensors;
    for (size_t i : shards[s]) {
      at::Tensor t = source.read(map[i].name);
      dtype = t.scalar_type();
      result.parameters += t.numel();
      result.bytes += sizes[i];
      tensors.push_back({map[i].hf_name, map[i].transposed ? t.t().contiguous() : t});
      weight_map[map[i].hf_name] = file;
    }
    checkpoint::write_safetensors((tmp / file).string(), tensors, {{"format", "pt"}});
    result.files.push_back(file);
    result.tensors += static_cast<int64_t>(tensors.size());
  }
  if (shards.size() > 1) write_index(tmp / "model.safetensors.index.json", weight_map, result.bytes);
  std::ofstream config(tmp / "config.json");
  config << hf::config_to_hf(source.config(), torch_dtype_name(dtype)).dump(2) << "\n";
  config.close();
  if (!config) throw Error("cannot write '" + (tmp / "config.json").string() + "'");
  fs::rename(tmp, dir);
  return result;
}

namespace {

std::unique_ptr<WeightSource> open_checked(const std::string& path, const models::GPTConfig& recipe) {
  std::unique_ptr<WeightSource> source;
  try {
    source = open_weights(path);
  } catch (const UsageError& e) {
    // Most often the pre-training run was never made, or under another run.dir (make demo writes runs/demo).
    const std::string fix = fs::exists(path) ? "" : "; train the run it names first, or point it at one that "
                                                    "exists: --set model.init_from=runs/demo after make demo";
    throw UsageError("model.init_from: " + std::string(e.what()) + fix);
  }
  const auto mismatches = hf::compare_model(recipe, source->config());
  if (!mismatches.empty()) throw UsageError(hf::describe_mismatches(mismatches, source->describe()));
  source->check();
  return source;
}

}  // namespace

void check_initial_weights(const std::string& path, const models::GPTConfig& recipe) { open_checked(path, recipe); }

InitialWeights load_initial_weights(const std::string& path, const models::GPTConfig& recipe,
                                    const std::map<std::string, at::Tensor>& shards, int tp_rank, int tp_size) {
  const std::unique_ptr<WeightSource> source = open_checked(path, recipe);
  const models::ParallelPlan plan(recipe), stored(source->config());
  torch::NoGradGuard no_grad;
  for (const auto& [name, shard] : shards) {
    // LoRA adapters the weights do not have (a base model for a LoRA fine-tune) keep their initial values:
    // B = 0, so the adapted model starts as the base.
    if (!stored.contains(name) && models::is_lora_adapter(name)) continue;
    at::Tensor part = models::shard_of(plan, name, source->read(name), tp_rank, tp_size);
    if (part.sizes() != shard.sizes())
      throw Error("model.init_from: '" + name + "' gives a shard of " + shape_text(part.sizes().vec()) +
                  " for this rank's " + shape_text(shard.sizes().vec()));
    shard.detach().copy_(part);
  }
  return {"initial weights from " + source->describe() + " (model.init_from)", source->warnings()};
}

}  // namespace crosstrain::train
