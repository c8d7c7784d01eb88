// Hugging Face layout in and out (issue 17, item 3). The export is read back by a reader written here only from
// the safetensors specification (8-byte little-endian header length, a JSON header of {dtype, shape,
// data_offsets} and __metadata__, then the bytes) and transformers' config keys; the expected tensor names and
// shapes are spelled out here, not taken from the mapping under test. Then: round trips give identical bytes,
// a re-imported model gives the same logits, init_from gives every layout the single process's first loss, and
// bad inputs are clear errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "crosstrain/core/error.h"
#include "crosstrain/models/gpt.h"
#include "crosstrain/interop/hf/checkpoint.h"
#include "crosstrain/interop/hf/layout.h"
#include "in_process_run.h"
#include "train_fixture.h"
#include "scratch.h"

using namespace crosstrain;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// ---- a safetensors reader and writer from the specification alone ----

struct SpecTensor {
  std::string dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};
struct SpecFile {
  std::map<std::string, SpecTensor> tensors;
  json metadata;
};

int64_t spec_dtype_size(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  if (dtype == "F64" || dtype == "I64") return 8;
  throw std::runtime_error("dtype " + dtype);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

SpecFile read_by_spec(const std::string& path) {
  const std::string all = slurp(path);
  if (all.size() < 8) throw std::runtime_error(path + ": shorter than 8 bytes");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(all[i])) << (8 * i);
  const json header = json::parse(all.substr(8, n));
  const std::string data = all.substr(8 + n);
  SpecFile f;
  for (const auto& [name, e] : header.items()) {
    if (name == "__metadata__") {
      f.metadata = e;
      continue;
    }
    SpecTensor t{e.at("dtype").get<std::string>(), e.at("shape").get<std::vector<int64_t>>(), ""};
    const auto off = e.at("data_offsets").get<std::vector<uint64_t>>();
    int64_t numel = 1;
    for (auto d : t.shape) numel *= d;
    if (off.size() != 2 || off[1] > data.size() || off[1] - off[0] != static_cast<uint64_t>(numel * spec_dtype_size(t.dtype)))
      throw std::runtime_error(path + ": bad data_offsets for " + name);
    t.bytes = data.substr(off[0], off[1] - off[0]);
    f.tensors[name] = t;
  }
  return f;
}

void write_by_spec(const std::string& path, const std::map<std::string, at::Tensor>& tensors) {
  json header = json::object();
  std::string data;
  for (const auto& [name, t] : tensors) {
    at::Tensor c = t.contiguous().to(at::kFloat);
    const size_t begin = data.size();
    data.append(static_cast<const char*>(c.data_ptr()), c.numel() * 4);
    header[name] = {{"dtype", "F32"}, {"shape", c.sizes().vec()}, {"data_offsets", {begin, data.size()}}};
  }
  const std::string text = header.dump();
  std::string len(8, '\0');
  for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  std::ofstream(path, std::ios::binary) << len << text << data;
}

at::Tensor as_tensor(const SpecTensor& t) {
  EXPECT_EQ(t.dtype, "F32");
  at::Tensor out = torch::empty(t.shape, torch::kFloat);
  std::memcpy(out.data_ptr(), t.bytes.data(), t.bytes.size());
  return out;
}

// ---- models and sources ----

// This process's directories, under one root removed at exit: ctest runs the tests as parallel processes.
const fs::path& root() {
  static const struct Root {
    fs::path path = crosstrain::testing::scratch_dir("hf-tests");
    ~Root() {
      std::error_code ec;
      fs::remove_all(path, ec);
    }
  } r;
  return r.path;
}

std::string temp_dir(const std::string& tag) {
  const fs::path p = root() / tag;
  fs::remove_all(p);
  fs::remove_all(p.string() + ".tmp");
  return p.string();
}

// Weights held in memory, for exporting a single-device model.
class TensorMapSource : public train::WeightSource {
 public:
  TensorMapSource(models::GPTConfig c, std::map<std::string, at::Tensor> t) : c_(std::move(c)), t_(std::move(t)) {}
  const models::GPTConfig& config() const override { return c_; }
  std::string describe() const override { return "test model"; }
  void check() const override {}
  at::Tensor read(const std::string& name) override { return t_.at(name).detach().clone(); }
  int64_t bytes(const std::string& name) const override { return t_.at(name).numel() * 4; }

 private:
  models::GPTConfig c_;
  std::map<std::string, at::Tensor> t_;
};

// The model's own parameter tensors (writing into them changes the model).
std::map<std::string, at::Tensor> parameters_of(models::GPT& model) {
  std::map<std::string, at::Tensor> out;
  for (const auto& p : model->named_parameters()) out[p.key()] = p.value();
  return out;
}

models::GPTConfig small_model(const std::string& arch, bool tied = false) {
  models::GPTConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 32;
  c.block_size = 16;
  c.vocab_size = 96;
  c.arch = models::parse_model_arch(arch);
  if (arch == "llama") {
    c.n_kv_head = 2;
    c.ffn_hidden = 80;
    c.rope_theta = 5000;
    c.norm_eps = 1e-6;
    c.tie_embeddings = tied;
  }
  return c;
}

at::Tensor fixed_tokens(const models::GPTConfig& c) {
  return torch::arange(2 * c.block_size, torch::kLong).mul(7).add(3).remainder(c.vocab_size).reshape({2, c.block_size});
}

double max_logit_difference(models::GPT& a, models::GPT& b) {
  torch::NoGradGuard g;
  a->eval();
  b->eval();
  const at::Tensor tokens = fixed_tokens(a->config());
  return (a->forward(tokens) - b->forward(tokens)).abs().max().item<double>();
}

// The names and [out, in]/[in, out] shapes transformers' GPT2LMHeadModel has, spelled out.
std::map<std::string, std::vector<int64_t>> expected_gpt2(int64_t L, int64_t d, int64_t T, int64_t V) {
  std::map<std::string, std::vector<int64_t>> e{{"transformer.wte.weight", {V, d}}, {"transformer.wpe.weight", {T, d}},
                                                {"transformer.ln_f.weight", {d}},   {"transformer.ln_f.bias", {d}},
                                                {"lm_head.weight", {V, d}}};
  for (int64_t i = 0; i < L; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    e[h + "ln_1.weight"] = e[h + "ln_1.bias"] = e[h + "ln_2.weight"] = e[h + "ln_2.bias"] = {d};
    e[h + "attn.c_attn.weight"] = {d, 3 * d};  // Conv1D: [in, out]
    e[h + "attn.c_attn.bias"] = {3 * d};
    e[h + "attn.c_proj.weight"] = {d, d};
    e[h + "attn.c_proj.bias"] = e[h + "mlp.c_proj.bias"] = {d};
    e[h + "mlp.c_fc.weight"] = {d, 4 * d};
    e[h + "mlp.c_fc.bias"] = {4 * d};
    e[h + "mlp.c_proj.weight"] = {4 * d, d};
  }
  return e;
}

// LlamaForCausalLM's names and shapes ([out, in], as torch Linear).
std::map<std::string, std::vector<int64_t>> expected_llama(const models::GPTConfig& c) {
  const int64_t d = c.n_embd, hd = d / c.n_head, kv = c.n_kv_head * hd, F = c.ffn_hidden, V = c.vocab_size;
  std::map<std::string, std::vector<int64_t>> e{{"model.embed_tokens.weight", {V, d}}, {"model.norm.weight", {d}}};
  if (!c.tie_embeddings) e["lm_head.weight"] = {V, d};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".";
    e[l + "input_layernorm.weight"] = e[l + "post_attention_layernorm.weight"] = {d};
    e[l + "self_attn.q_proj.weight"] = e[l + "self_attn.o_proj.weight"] = {d, d};
    e[l + "self_attn.k_proj.weight"] = e[l + "self_attn.v_proj.weight"] = {kv, d};
    e[l + "mlp.gate_proj.weight"] = e[l + "mlp.up_proj.weight"] = {F, d};
    e[l + "mlp.down_proj.weight"] = {d, F};
  }
  return e;
}

template <typename Map>
std::set<std::string> keys(const Map& m) {
  std::set<std::string> out;
  for (const auto& [k, v] : m) out.insert(k);
  return out;
}

train::Config trained_config(const std::string& tag) {
  auto c = crosstrain::testing::tiny_config(tag);
  c.run.dir = (root() / ("run_" + tag)).string();
  c.train.steps = 2;
  c.train.warmup_steps = 0;
  return c;
}

// A run of `c` on `ranks` threads: rank 0's result and dump.
crosstrain::testing::RankRun run(const train::Config& c, int ranks = 1) {
  fs::remove_all(c.run.dir);
  return crosstrain::testing::train_in_process(c, ranks)[0];
}

// A GPT trained for 2 steps by the trainer, and its Hugging Face export. Built once for the tests below.
struct TrainedGpt {
  train::Config config;
  std::map<std::string, at::Tensor> params;  // after training, by crosstrain name
  std::string hf_dir;
};
const TrainedGpt& trained_gpt() {
  static const TrainedGpt t = [] {
    TrainedGpt t;
    t.config = trained_config("hf_trained");
    t.params = run(t.config).dump.shards;
    t.hf_dir = temp_dir("trained_export");
    auto source = train::open_weights(t.config.run.dir);
    train::write_hf_directory(t.hf_dir, *source, int64_t{1} << 40);
    return t;
  }();
  return t;
}

}  // namespace

// (a) The trainer's checkpoint, exported: config.json's keys and model.safetensors read back by the spec.
TEST(HfExport, GptCheckpointReadsBackBySpec) {
  const auto& t = trained_gpt();
  const auto& m = t.config.model;
  const json cfg = json::parse(slurp(t.hf_dir + "/config.json"));
  EXPECT_EQ(cfg.at("model_type"), "gpt2");
  EXPECT_EQ(cfg.at("architectures"), json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(cfg.at("n_embd"), m.n_embd);
  EXPECT_EQ(cfg.at("n_head"), m.n_head);
  EXPECT_EQ(cfg.at("n_layer"), m.n_layer);
  EXPECT_EQ(cfg.at("n_positions"), m.block_size);
  EXPECT_EQ(cfg.at("n_ctx"), m.block_size);
  EXPECT_EQ(cfg.at("vocab_size"), m.vocab_size);
  EXPECT_EQ(cfg.at("activation_function"), "gelu");  // exact GELU, not GPT-2's gelu_new
  EXPECT_EQ(cfg.at("tie_word_embeddings"), false);
  EXPECT_DOUBLE_EQ(cfg.at("layer_norm_epsilon").get<double>(), 1e-5);
  EXPECT_EQ(cfg.at("torch_dtype"), "float32");
  EXPECT_FALSE(fs::exists(t.hf_dir + "/model.safetensors.index.json"));

  const SpecFile f = read_by_spec(t.hf_dir + "/model.safetensors");
  EXPECT_EQ(f.metadata.at("format"), "pt");
  const auto expected = expected_gpt2(m.n_layer, m.n_embd, m.block_size, m.vocab_size);
  ASSERT_EQ(keys(f.tensors), keys(expected));
  for (const auto& [hf, shape] : expected) {
    const SpecTensor& st = f.tensors.at(hf);
    EXPECT_EQ(st.shape, shape) << hf;
    EXPECT_EQ(st.dtype, "F32") << hf;
    std::string name = hf.rfind("transformer.", 0) == 0 ? hf.substr(12) : hf;
    const bool conv1d = hf.find(".weight") != std::string::npos &&
                        (hf.find("c_attn") != std::string::npos || hf.find("c_proj") != std::string::npos ||
                         hf.find("c_fc") != std::string::npos);
    const at::Tensor ours = t.params.at(name);
    EXPECT_TRUE(torch::equal(as_tensor(st), conv1d ? ours.t() : ours)) << hf;
  }
}

// (a) A sharded export: model-0000i-of-0000N files and an index whose weight_map and total_size agree with them.
TEST(HfExport, ShardedExportHasIndex) {
  const auto& t = trained_gpt();
  const std::string dir = temp_dir("sharded");
  const int64_t limit = 40000;  // bytes: the model is ~115 kB
  auto source = train::open_weights(t.config.run.dir);
  train::write_hf_directory(dir, *source, limit);
  const json index = json::parse(slurp(dir + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors"));
  std::map<std::string, std::string> weight_map = index.at("weight_map");
  std::set<std::string> files;
  for (const auto& [name, file] : weight_map) files.insert(file);
  ASSERT_GE(files.size(), 3u);
  int64_t total = 0;
  std::set<std::string> seen;
  const std::string count = std::to_string(files.size());
  for (const auto& file : files) {
    EXPECT_TRUE(file.size() == 32 && file.rfind("model-0000", 0) == 0 && file.find("-of-0000" + count) != std::string::npos)
        << file;
    const SpecFile f = read_by_spec(dir + "/" + file);
    EXPECT_EQ(f.metadata.at("format"), "pt");
    int64_t bytes = 0;
    for (const auto& [name, st] : f.tensors) {
      EXPECT_EQ(weight_map.at(name), file) << name;
      EXPECT_TRUE(seen.insert(name).second) << name << " in two files";
      bytes += static_cast<int64_t>(st.bytes.size());
    }
    EXPECT_TRUE(bytes <= limit || f.tensors.size() == 1) << file << " holds " << bytes << " bytes";
    total += bytes;
  }
  EXPECT_EQ(seen, keys(weight_map));
  EXPECT_EQ(index.at("metadata").at("total_size").get<int64_t>(), total);
  // The sharded directory reads back like the single file.
  const SpecFile whole = read_by_spec(t.hf_dir + "/model.safetensors");
  EXPECT_EQ(seen, keys(whole.tensors));
}

// (a) Llama's names and [out, in] shapes, grouped-query k/v, and a tied head without lm_head.weight.
TEST(HfExport, LlamaReadsBackBySpec) {
  for (bool tied : {false, true}) {
    const auto c = small_model("llama", tied);
    models::GPT model(c, 5);
    const auto params = parameters_of(model);
    const std::string dir = temp_dir(tied ? "llama_tied" : "llama");
    TensorMapSource source(c, params);
    train::write_hf_directory(dir, source, int64_t{1} << 40);
    const json cfg = json::parse(slurp(dir + "/config.json"));
    EXPECT_EQ(cfg.at("model_type"), "llama");
    EXPECT_EQ(cfg.at("architectures"), json::array({"LlamaForCausalLM"}));
    EXPECT_EQ(cfg.at("hidden_size"), 32);
    EXPECT_EQ(cfg.at("intermediate_size"), 80);
    EXPECT_EQ(cfg.at("num_attention_heads"), 4);
    EXPECT_EQ(cfg.at("num_key_value_heads"), 2);
    EXPECT_EQ(cfg.at("num_hidden_layers"), 2);
    EXPECT_EQ(cfg.at("head_dim"), 8);
    EXPECT_EQ(cfg.at("max_position_embeddings"), 16);
    EXPECT_EQ(cfg.at("vocab_size"), 96);
    EXPECT_DOUBLE_EQ(cfg.at("rms_norm_eps").get<double>(), 1e-6);
    EXPECT_DOUBLE_EQ(cfg.at("rope_theta").get<double>(), 5000);
    EXPECT_EQ(cfg.at("tie_word_embeddings"), tied);
    EXPECT_EQ(cfg.at("hidden_act"), "silu");
    EXPECT_EQ(cfg.at("attention_bias"), false);
    EXPECT_EQ(cfg.at("mlp_bias"), false);
    const SpecFile f = read_by_spec(dir + "/model.safetensors");
    const auto expected = expected_llama(c);
    ASSERT_EQ(keys(f.tensors), keys(expected)) << "tied " << tied;
    for (const auto& [hf, shape] : expected) EXPECT_EQ(f.tensors.at(hf).shape, shape) << hf;
    EXPECT_TRUE(torch::equal(as_tensor(f.tensors.at("model.layers.1.self_attn.k_proj.weight")),
                             params.at("h.1.attn.k_proj.weight")));
    EXPECT_TRUE(torch::equal(as_tensor(f.tensors.at("model.layers.0.post_attention_layernorm.weight")),
                             params.at("h.0.mlp_norm.weight")));
  }
}

// (b) Import -> export, through the library and through the trainer: identical bytes per tensor.
TEST(HfRoundTrip, ImportExportIdenticalBytes) {
  const auto& t = trained_gpt();
  const std::string sharded = temp_dir("rt_sharded"), again = temp_dir("rt_again");
  auto first = train::open_weights(t.hf_dir);
  train::write_hf_directory(sharded, *first, 30000);  // single file -> shards
  auto second = train::open_weights(sharded);
  train::write_hf_directory(again, *second, int64_t{1} << 40);  // shards -> single file
  const SpecFile a = read_by_spec(t.hf_dir + "/model.safetensors"), b = read_by_spec(again + "/model.safetensors");
  ASSERT_EQ(keys(a.tensors), keys(b.tensors));
  for (const auto& [name, st] : a.tensors) EXPECT_EQ(st.bytes, b.tensors.at(name).bytes) << name;

  // The trainer: init_from the export and one step, the last of its cosine schedule, so at min_lr = 0: the run's
  // checkpoint holds the imported weights unchanged; exported again, byte for byte the same.
  auto c = trained_config("hf_roundtrip");
  c.model_init_from = t.hf_dir;
  c.train.steps = 1;
  c.train.min_lr = 0;
  run(c);
  const std::string exported = temp_dir("rt_trainer");
  auto from_run = train::open_weights(c.run.dir);
  train::write_hf_directory(exported, *from_run, int64_t{1} << 40);
  const SpecFile e = read_by_spec(exported + "/model.safetensors");
  ASSERT_EQ(keys(a.tensors), keys(e.tensors));
  for (const auto& [name, st] : a.tensors) EXPECT_EQ(st.bytes, e.tensors.at(name).bytes) << name;
  EXPECT_EQ(slurp(t.hf_dir + "/config.json"), slurp(exported + "/config.json"));
}

// (c) A model exported and re-imported (model.init_from's loader) gives the original's logits, for both families.
TEST(HfRoundTrip, ReimportedLogitsMatch) {
  for (const std::string arch : {"gpt", "llama", "llama-tied"}) {
    const auto c = small_model(arch == "gpt" ? "gpt" : "llama", arch == "llama-tied");
    models::GPT original(c, 11);
    const std::string dir = temp_dir("logits_" + arch);
    TensorMapSource source(c, parameters_of(original));
    train::write_hf_directory(dir, source, 20000);
    models::GPT imported(c, 12);  // another seed: different weights until imported
    EXPECT_GT(max_logit_difference(original, imported), 1e-3) << arch;
    train::load_initial_weights(dir, c, parameters_of(imported), 0, 1);
    EXPECT_LT(max_logit_difference(original, imported), 1e-5) << arch;
    EXPECT_EQ(train::hf_model_config(dir).arch, c.arch);
  }
}

// (c) GPT-2 as transformers' own files are: names without "transformer." (saved from GPT2Model), Conv1D [in, out]
// weights, attention-mask buffers, no lm_head.weight (tied: tie_word_embeddings omitted, true by default), and
// config keys omitted (gelu_new by default: imported, with a warning).
TEST(HfImport, Gpt2BaseModelLayoutWithTiedHead) {
  const auto c = small_model("gpt");
  models::GPT original(c, 21);
  {
    torch::NoGradGuard g;
    original->lm_head->weight.copy_(original->wte->weight);  // the tied model transformers would build
  }
  std::map<std::string, at::Tensor> file;
  for (const auto& [name, t] : parameters_of(original)) {
    if (name == "lm_head.weight") continue;
    const bool conv1d = t.dim() == 2 && name.find("wte") == std::string::npos && name.find("wpe") == std::string::npos;
    file[name] = conv1d ? t.t() : t;
  }
  for (int i = 0; i < c.n_layer; ++i)
    file["h." + std::to_string(i) + ".attn.bias"] = torch::ones({1, 1, c.block_size, c.block_size}).tril();
  const std::string dir = temp_dir("gpt2_base");
  fs::create_directories(dir);
  write_by_spec(dir + "/model.safetensors", file);
  std::ofstream(dir + "/config.json") << json{{"model_type", "gpt2"}, {"n_embd", 32}, {"n_head", 4}, {"n_layer", 2},
                                              {"n_positions", 16}, {"vocab_size", 96}}.dump();
  models::GPT imported(c, 22);
  const auto w = train::load_initial_weights(dir, c, parameters_of(imported), 0, 1);
  EXPECT_LT(max_logit_difference(original, imported), 1e-5);
  ASSERT_EQ(w.warnings.size(), 1u);
  EXPECT_NE(w.warnings[0].find("gelu_new"), std::string::npos) << w.warnings[0];
  EXPECT_NE(w.line.find(dir), std::string::npos) << w.line;
}

// (d) init_from in other layouts: the first step's loss equals the single process's, and differs from a run
// without init_from (so the weights were loaded, not drawn).
TEST(HfInitFrom, LayoutsStartFromTheSameWeights) {
  const auto& t = trained_gpt();
  auto base = trained_config("hf_init_single");
  base.model_init_from = t.hf_dir;
  base.train.steps = 1;
  base.train.micro_batches = 2;
  const double single = run(base).result.steps.at(0).loss;
  auto fresh = base;
  fresh.model_init_from.clear();
  fresh.run.dir += "_fresh";
  EXPECT_GT(std::abs(run(fresh).result.steps.at(0).loss - single), 1e-3);
  struct Layout {
    const char* name;
    int dp, tp, pp, zero;
  };
  for (const Layout l : {Layout{"tp2", 1, 2, 1, 0}, Layout{"pp2", 1, 1, 2, 0}, Layout{"dp2_zero3", 2, 1, 1, 3}}) {
    auto c = base;
    c.run.dir += std::string("_") + l.name;
    c.parallel.dp = l.dp;
    c.parallel.tp = l.tp;
    c.parallel.pp = l.pp;
    c.parallel.zero = l.zero;
    const double loss = run(c, l.dp * l.tp * l.pp).result.steps.at(0).loss;
    EXPECT_NEAR(loss, single, 1e-5 * single) << l.name;
  }
}

// (d) A Llama with grouped-query attention and a tied head, imported from Hugging Face's layout into
// tensor-parallel ranks (k and v split by key/value heads, the head by vocabulary): the single process's loss.
TEST(HfInitFrom, LlamaTensorParallelStartsFromTheImport) {
  auto base = trained_config("hf_llama_single");
  base.model.arch = models::ModelArch::Llama;
  base.model.n_head = 4;
  base.model.n_kv_head = 2;
  base.model.tie_embeddings = true;
  base.train.steps = 1;
  models::GPT source_model(base.model, 77);
  const std::string dir = temp_dir("llama_init");
  TensorMapSource source(base.model, parameters_of(source_model));
  train::write_hf_directory(dir, source, int64_t{1} << 40);
  auto fresh = base;
  const double drawn = run(fresh).result.steps.at(0).loss;
  base.model_init_from = dir;
  const double single = run(base).result.steps.at(0).loss;
  EXPECT_GT(std::abs(drawn - single), 1e-3);
  auto tp = base;
  tp.run.dir += "_tp2";
  tp.parallel.tp = 2;
  EXPECT_NEAR(run(tp, 2).result.steps.at(0).loss, single, 1e-5 * single);
}

// (e) Bad inputs: one clear UsageError each, naming what is wrong and how to fix it.
static std::string init_error(const std::string& path, const models::GPTConfig& recipe) {
  models::GPT model(recipe, 1);
  try {
    train::load_initial_weights(path, recipe, parameters_of(model), 0, 1);
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.find('\n'), std::string::npos) << "one line: " << what;
    return what;
  }
  return "no error";
}

TEST(HfInitFrom, BadInputsAreClearErrors) {
  const auto& t = trained_gpt();
  auto recipe = t.config.model;
  recipe.n_layer = 3;
  recipe.n_embd = 48;
  std::string e = init_error(t.hf_dir, recipe);
  EXPECT_NE(e.find("model.n_layer is 3 in the recipe but 2 in the weights (fix: --set model.n_layer=2)"), std::string::npos) << e;
  EXPECT_NE(e.find("--set model.n_embd=32"), std::string::npos) << e;
  recipe = t.config.model;
  recipe.arch = models::ModelArch::Llama;
  e = init_error(t.hf_dir, recipe);
  EXPECT_NE(e.find("--set model.arch=\"gpt\""), std::string::npos) << e;

  // A tensor missing, one of the wrong shape, one unknown.
  const std::string broken = temp_dir("broken");
  fs::create_directories(broken);
  fs::copy_file(t.hf_dir + "/config.json", broken + "/config.json");
  std::map<std::string, at::Tensor> file;
  for (const auto& [name, st] : read_by_spec(t.hf_dir + "/model.safetensors").tensors) file[name] = as_tensor(st);
  file.erase("transformer.h.1.mlp.c_fc.bias");
  file["transformer.ln_f.weight"] = torch::ones({7});
  file["transformer.h.0.attn.rotary"] = torch::ones({2});
  write_by_spec(broken + "/model.safetensors", file);
  e = init_error(broken, t.config.model);
  EXPECT_NE(e.find("missing tensors: transformer.h.1.mlp.c_fc.bias"), std::string::npos) << e;
  EXPECT_NE(e.find("transformer.ln_f.weight is [7], config.json needs [32]"), std::string::npos) << e;
  EXPECT_NE(e.find("tensors this model does not have: transformer.h.0.attn.rotary"), std::string::npos) << e;

  // A truncated file.
  const std::string cut = temp_dir("truncated");
  fs::create_directories(cut);
  fs::copy_file(t.hf_dir + "/config.json", cut + "/config.json");
  const std::string bytes = slurp(t.hf_dir + "/model.safetensors");
  std::ofstream(cut + "/model.safetensors", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  e = init_error(cut, t.config.model);
  EXPECT_NE(e.find("model.safetensors"), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;

  // Another model type, and a path that is not there.
  std::ofstream(cut + "/config.json") << R"({"model_type": "bert"})";
  e = init_error(cut, t.config.model);
  EXPECT_NE(e.find("model_type \"bert\" is not supported"), std::string::npos) << e;
  e = init_error(temp_dir("absent"), t.config.model);
  EXPECT_NE(e.find("does not exist"), std::string::npos) << e;
}

// The pure parts: sizes as transformers counts them, and how tensors fall into shards.
TEST(HfLayout, SizesAndShardPlan) {
  EXPECT_EQ(train::hf::parse_size("5GB"), 5000000000LL);
  EXPECT_EQ(train::hf::parse_size("2GiB"), 2147483648LL);
  EXPECT_EQ(train::hf::parse_size("300kb"), 300000);
  EXPECT_EQ(train::hf::parse_size("4096"), 4096);
  EXPECT_THROW(train::hf::parse_size("lots"), UsageError);
  EXPECT_THROW(train::hf::parse_size("0MB"), UsageError);
  using Plan = std::vector<std::vector<size_t>>;
  EXPECT_EQ(train::hf::plan_shards({4, 4, 4}, 8), (Plan{{0, 1}, {2}}));
  EXPECT_EQ(train::hf::plan_shards({2, 20, 2}, 8), (Plan{{0}, {1}, {2}}));  // too big: alone
  EXPECT_EQ(train::hf::shard_file_name(2, 3), "model-00002-of-00003.safetensors");
  EXPECT_EQ(train::hf::shard_file_name(1, 1), "model.safetensors");
}

// The command line: `crosstrain ckpt export --format hf RUN --out DIR --max-shard-size ...`.
TEST(HfExport, CommandLine) {
  const auto& t = trained_gpt();
  const std::string dir = temp_dir("cli");
  const std::string cmd = std::string(CT_CROSSTRAIN_BIN) + " ckpt export --format hf " + t.config.run.dir + " --out " +
                          dir + " --max-shard-size 50KB > " + dir + ".log 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(dir + ".log");
  EXPECT_NE(slurp(dir + ".log").find("model.safetensors.index.json"), std::string::npos) << slurp(dir + ".log");
  EXPECT_TRUE(fs::exists(dir + "/model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(dir + "/config.json"));
  // An existing directory is not overwritten.
  EXPECT_NE(std::system(cmd.c_str()), 0);
  EXPECT_NE(slurp(dir + ".log").find("already exists"), std::string::npos) << slurp(dir + ".log");
}

// `crosstrain train --nproc 2` with a model.init_from of another shape: refused once, before any rank starts.
TEST(HfInitFrom, CommandLineRefusesAMismatchBeforeLaunching) {
  const auto& t = trained_gpt();
  const std::string log = temp_dir("cli_train") + ".log";
  const std::string cmd = std::string(CT_CROSSTRAIN_BIN) + " train " + CT_SOURCE_DIR + "/recipes/gpt-tiny.toml" +
                          " --nproc 2 --set data.path=" + crosstrain::testing::corpus_file() + " --set run.dir=" +
                          temp_dir("cli_train_run") + " --set model.init_from=" + t.hf_dir + " > " + log + " 2>&1";
  const int status = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 2) << slurp(log);
  const std::string out = slurp(log);
  EXPECT_NE(out.find("model.n_layer is 4 in the recipe but 2 in the weights (fix: --set model.n_layer=2)"),
            std::string::npos) << out;
  EXPECT_EQ(out.find("[rank"), std::string::npos) << "checked before launching: " << out;
}
