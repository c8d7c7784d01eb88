#include "crosstrain/interop/hf/layout.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <map>

#include "crosstrain/core/error.h"
#include "crosstrain/models/parallel_plan.h"

namespace crosstrain::train::hf {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

bool starts_with(const std::string& s, const std::string& head) { return s.compare(0, head.size(), head) == 0; }

// The base model's attribute in the causal-LM class (transformers' base_model_prefix).
std::string base_prefix(const models::GPTConfig& config) { return config.is_llama() ? "model." : "transformer."; }

// GPT-2 keeps these as transformers' Conv1D: weight [in, out], y = x W + b.
bool gpt2_conv1d_weight(const std::string& name) {
  return ends_with(name, ".attn.c_attn.weight") || ends_with(name, ".attn.c_proj.weight") ||
         ends_with(name, ".mlp.c_fc.weight") || ends_with(name, ".mlp.c_proj.weight");
}

// "h.3.attn.q_proj.weight" -> Llama's "model.layers.3.self_attn.q_proj.weight".
std::string llama_name(const std::string& name) {
  static const std::map<std::string, std::string> whole{
      {"wte.weight", "model.embed_tokens.weight"}, {"ln_f.weight", "model.norm.weight"},
      {"lm_head.weight", "lm_head.weight"}};
  static const std::map<std::string, std::string> in_block{
      {"attn_norm.weight", "input_layernorm.weight"},   {"attn.q_proj.weight", "self_attn.q_proj.weight"},
      {"attn.k_proj.weight", "self_attn.k_proj.weight"}, {"attn.v_proj.weight", "self_attn.v_proj.weight"},
      {"attn.o_proj.weight", "self_attn.o_proj.weight"}, {"mlp_norm.weight", "post_attention_layernorm.weight"},
      {"mlp.gate_proj.weight", "mlp.gate_proj.weight"},  {"mlp.up_proj.weight", "mlp.up_proj.weight"},
      {"mlp.down_proj.weight", "mlp.down_proj.weight"}};
  if (auto it = whole.find(name); it != whole.end()) return it->second;
  if (starts_with(name, "h.")) {
    const size_t dot = name.find('.', 2);
    if (dot != std::string::npos)
      if (auto it = in_block.find(name.substr(dot + 1)); it != in_block.end())
        return "model.layers." + name.substr(2, dot - 2) + "." + it->second;
  }
  throw Error("no Hugging Face name for the llama parameter '" + name + "' (interop/hf/layout.cpp)");
}

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

// A key of config.json, or `fallback` when absent or null (transformers' default).
template <typename T>
T get(const nlohmann::json& j, const std::string& key, T fallback, const std::string& source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw UsageError(source + ": \"" + key + "\" has the wrong type (" + it->dump() + ")");
  }
}

bool close_to(double a, double b) { return std::fabs(a - b) <= 1e-9 * std::max(std::fabs(a), std::fabs(b)); }

std::string torch_dtype_of(const nlohmann::json& j, const std::string& source) {
  // transformers wrote "torch_dtype" until 4.56 and "dtype" since.
  std::string dtype = get<std::string>(j, "torch_dtype", "", source);
  return dtype.empty() ? get<std::string>(j, "dtype", "", source) : dtype;
}

HfConfig gpt2_from_hf(const nlohmann::json& j, const std::string& source) {
  HfConfig out;
  models::GPTConfig& m = out.model;
  m.arch = models::ModelArch::Gpt;
  m.vocab_size = get<int64_t>(j, "vocab_size", 50257, source);
  m.block_size = get<int64_t>(j, "n_positions", get<int64_t>(j, "n_ctx", 1024, source), source);
  m.n_embd = get<int64_t>(j, "n_embd", 768, source);
  m.n_layer = get<int64_t>(j, "n_layer", 12, source);
  m.n_head = get<int64_t>(j, "n_head", 12, source);
  m.dropout = get<double>(j, "resid_pdrop", 0.1, source);
  const int64_t inner = get<int64_t>(j, "n_inner", 4 * m.n_embd, source);
  if (inner != 4 * m.n_embd)
    throw UsageError(source + ": n_inner " + std::to_string(inner) + " is not 4 x n_embd (" +
                     std::to_string(4 * m.n_embd) + "); crosstrain's GPT has a 4 n_embd MLP");
  const double eps = get<double>(j, "layer_norm_epsilon", 1e-5, source);
  if (!close_to(eps, 1e-5))
    throw UsageError(source + ": layer_norm_epsilon " + number(eps) + "; crosstrain's GPT uses LayerNorm eps 1e-5");
  if (get<bool>(j, "scale_attn_by_inverse_layer_idx", false, source) || !get<bool>(j, "scale_attn_weights", true, source))
    throw UsageError(source + ": attention scaled other than by 1/sqrt(head_dim) (scale_attn_weights, "
                     "scale_attn_by_inverse_layer_idx) is not supported");
  const std::string act = get<std::string>(j, "activation_function", "gelu_new", source);
  if (act == "gelu_new" || act == "gelu_pytorch_tanh" || act == "gelu_fast")
    out.warnings.push_back(source + ": activation_function \"" + act + "\" is GELU's tanh approximation; "
                           "crosstrain's GPT computes exact GELU (erf), so logits differ slightly (about 1e-3)");
  else if (act != "gelu")
    throw UsageError(source + ": activation_function \"" + act + "\" is not supported (crosstrain's GPT: gelu)");
  out.tied_head = get<bool>(j, "tie_word_embeddings", true, source);  // PretrainedConfig's default
  return out;
}

HfConfig llama_from_hf(const nlohmann::json& j, const std::string& source) {
  HfConfig out;
  models::GPTConfig& m = out.model;
  m.arch = models::ModelArch::Llama;
  m.vocab_size = get<int64_t>(j, "vocab_size", 32000, source);
  m.n_embd = get<int64_t>(j, "hidden_size", 4096, source);
  m.ffn_hidden = get<int64_t>(j, "intermediate_size", 11008, source);
  m.n_layer = get<int64_t>(j, "num_hidden_layers", 32, source);
  m.n_head = get<int64_t>(j, "num_attention_heads", 32, source);
  m.n_kv_head = get<int64_t>(j, "num_key_value_heads", m.n_head, source);
  m.block_size = get<int64_t>(j, "max_position_embeddings", 2048, source);
  m.norm_eps = get<double>(j, "rms_norm_eps", 1e-6, source);
  m.rope_theta = get<double>(j, "rope_theta", 10000.0, source);
  m.dropout = get<double>(j, "attention_dropout", 0.0, source);
  m.tie_embeddings = get<bool>(j, "tie_word_embeddings", false, source);
  out.tied_head = m.tie_embeddings;
  if (m.n_head <= 0 || m.n_embd % m.n_head != 0)
    throw UsageError(source + ": hidden_size " + std::to_string(m.n_embd) + " is not a multiple of num_attention_heads " +
                     std::to_string(m.n_head));
  const int64_t head_dim = get<int64_t>(j, "head_dim", m.n_embd / m.n_head, source);
  if (head_dim != m.n_embd / m.n_head)
    throw UsageError(source + ": head_dim " + std::to_string(head_dim) + " is not hidden_size / num_attention_heads (" +
                     std::to_string(m.n_embd / m.n_head) + "); crosstrain's llama needs it to be");
  const std::string act = get<std::string>(j, "hidden_act", "silu", source);
  if (act != "silu") throw UsageError(source + ": hidden_act \"" + act + "\" is not supported (crosstrain's llama: silu)");
  if (get<bool>(j, "attention_bias", false, source) || get<bool>(j, "mlp_bias", false, source))
    throw UsageError(source + ": attention_bias / mlp_bias are not supported (crosstrain's llama has no biases)");
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    throw UsageError(source + ": rope_scaling " + j["rope_scaling"].dump() + " is not supported (plain RoPE only)");
  return out;
}

}  // namespace

std::string hf_name(const models::GPTConfig& config, const std::string& name) {
  if (config.is_llama()) return llama_name(name);
  return name == "lm_head.weight" ? name : "transformer." + name;
}

std::vector<TensorMapping> tensor_map(const models::GPTConfig& config) {
  std::vector<TensorMapping> out;
  const models::ParallelPlan plan(config);
  for (const auto& p : plan.parameters()) {
    TensorMapping m;
    m.name = p.name;
    m.hf_name = hf_name(config, p.name);
    m.shape = p.shape;
    m.transposed = !config.is_llama() && gpt2_conv1d_weight(p.name);
    m.hf_shape = m.transposed ? std::vector<int64_t>(p.shape.rbegin(), p.shape.rend()) : p.shape;
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<std::string> hf_name_candidates(const models::GPTConfig& config, const std::string& name) {
  const std::string prefix = base_prefix(config);
  if (starts_with(name, prefix)) return {name, name.substr(prefix.size())};
  return {name};
}

bool ignorable_hf_tensor(const models::GPTConfig& config, bool tied_head, const std::string& name) {
  if (tied_head && name == "lm_head.weight") return true;
  if (config.is_llama()) return ends_with(name, ".rotary_emb.inv_freq");
  return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias");
}

nlohmann::json config_to_hf(const models::GPTConfig& c, const std::string& torch_dtype) {
  nlohmann::json j;
  if (c.is_llama()) {
    j = {{"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"vocab_size", c.vocab_size},
         {"hidden_size", c.n_embd}, {"intermediate_size", c.mlp_hidden()}, {"num_hidden_layers", c.n_layer},
         {"num_attention_heads", c.n_head}, {"num_key_value_heads", c.kv_heads()}, {"head_dim", c.head_dim()},
         {"hidden_act", "silu"}, {"max_position_embeddings", c.block_size}, {"rms_norm_eps", c.norm_eps},
         {"rope_theta", c.rope_theta}, {"rope_scaling", nullptr}, {"attention_bias", false},
         {"attention_dropout", c.dropout}, {"mlp_bias", false}, {"tie_word_embeddings", c.tie_embeddings},
         {"initializer_range", 0.02}, {"use_cache", true}};
  } else {
    // Exact GELU ("gelu", not GPT-2's default "gelu_new") and an untied head, as crosstrain's GPT computes.
    j = {{"architectures", {"GPT2LMHeadModel"}}, {"model_type", "gpt2"}, {"vocab_size", c.vocab_size},
         {"n_positions", c.block_size}, {"n_ctx", c.block_size}, {"n_embd", c.n_embd}, {"n_layer", c.n_layer},
         {"n_head", c.n_head}, {"n_inner", nullptr}, {"activation_function", "gelu"},
         {"resid_pdrop", c.dropout}, {"embd_pdrop", c.dropout}, {"attn_pdrop", c.dropout},
         {"layer_norm_epsilon", 1e-5}, {"initializer_range", 0.02}, {"scale_attn_weights", true},
         {"scale_attn_by_inverse_layer_idx", false}, {"reorder_and_upcast_attn", false},
         {"tie_word_embeddings", false}, {"use_cache", true}};
  }
  j["torch_dtype"] = torch_dtype;
  return j;
}

HfConfig config_from_hf(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object()) throw UsageError(source + " is not a JSON object");
  const std::string type = get<std::string>(j, "model_type", "", source);
  HfConfig out;
  if (type == "gpt2") out = gpt2_from_hf(j, source);
  else if (type == "llama") out = llama_from_hf(j, source);
  else
    throw UsageError(source + ": model_type \"" + type + "\" is not supported; crosstrain reads \"gpt2\" "
                     "(GPT2LMHeadModel) and \"llama\" (LlamaForCausalLM)");
  out.torch_dtype = torch_dtype_of(j, source);
  try {
    out.model.validate();
  } catch (const UsageError& e) {
    throw UsageError(source + ": " + e.what());
  }
  return out;
}

std::vector<ConfigMismatch> compare_model(const models::GPTConfig& recipe, const models::GPTConfig& weights) {
  std::vector<ConfigMismatch> out;
  auto check = [&](const char* field, const std::string& r, const std::string& w) {
    if (r != w) out.push_back({field, r, w});
  };
  auto num = [](int64_t v) { return std::to_string(v); };
  check("arch", models::to_string(recipe.arch), models::to_string(weights.arch));
  if (!out.empty()) return out;  // every other field means something else in the other family
  check("n_layer", num(recipe.n_layer), num(weights.n_layer));
  check("n_head", num(recipe.n_head), num(weights.n_head));
  check("n_embd", num(recipe.n_embd), num(weights.n_embd));
  check("vocab_size", num(recipe.vocab_size), num(weights.vocab_size));
  if (!recipe.is_llama()) {
    check("block_size", num(recipe.block_size), num(weights.block_size));
    return out;
  }
  if (recipe.block_size > weights.block_size)  // rotary positions: any length up to what the weights were made for
    out.push_back({"block_size", num(recipe.block_size), num(weights.block_size)});
  check("n_kv_head", num(recipe.kv_heads()), num(weights.kv_heads()));
  check("ffn_hidden", num(recipe.mlp_hidden()), num(weights.mlp_hidden()));
  check("tie_embeddings", recipe.tie_embeddings ? "true" : "false", weights.tie_embeddings ? "true" : "false");
  if (!close_to(recipe.rope_theta, weights.rope_theta))
    out.push_back({"rope_theta", number(recipe.rope_theta), number(weights.rope_theta)});
  if (!close_to(recipe.norm_eps, weights.norm_eps))
    out.push_back({"norm_eps", number(recipe.norm_eps), number(weights.norm_eps)});
  return out;
}

std::string describe_mismatches(const std::vector<ConfigMismatch>& mismatches, const std::string& source) {
  // One line (the program prints an error's first line): the mismatches separated by "; ".
  std::string text = "model.init_from: the recipe's [model] does not match the weights in " + source + ": ";
  for (size_t i = 0; i < mismatches.size(); ++i) {
    const ConfigMismatch& m = mismatches[i];
    const std::string value = m.field == "arch" ? "\"" + m.weights + "\"" : m.weights;
    text += (i ? "; model." : "model.") + m.field + " is " + m.recipe + " in the recipe but " + m.weights +
            " in the weights (fix: --set model." + m.field + "=" + value + ")";
  }
  return text;
}

int64_t parse_size(const std::string& text) {
  size_t end = 0;
  double value = 0;
  try {
    value = std::stod(text, &end);
  } catch (const std::exception&) {
    end = 0;
  }
  std::string unit;
  for (size_t i = end; i < text.size(); ++i)
    if (!std::isspace(static_cast<unsigned char>(text[i]))) unit += static_cast<char>(std::toupper(text[i]));
  static const std::map<std::string, double> units{
      {"", 1},         {"B", 1},           {"KB", 1e3},           {"MB", 1e6},           {"GB", 1e9},
      {"TB", 1e12},    {"KIB", 1024.0},    {"MIB", 1048576.0},    {"GIB", 1073741824.0}, {"TIB", 1099511627776.0}};
  auto it = units.find(unit);
  if (end == 0 || it == units.end() || !(value * it->second >= 1))
    throw UsageError("size '" + text + "' is not a size: write e.g. 5GB (10^9 bytes), 500MB, 2GiB (2^30) or 4096");
  return static_cast<int64_t>(value * it->second);
}

std::vector<std::vector<size_t>> plan_shards(const std::vector<int64_t>& bytes, int64_t max_bytes) {
  std::vector<std::vector<size_t>> shards;
  int64_t filled = 0;
  for (size_t i = 0; i < bytes.size(); ++i) {
    if (shards.empty() || (filled > 0 && filled + bytes[i] > max_bytes)) {
      shards.emplace_back();
      filled = 0;
    }
    shards.back().push_back(i);
    filled += bytes[i];
  }
  return shards;
}

std::string shard_file_name(size_t index, size_t count) {
  if (count == 1) return "model.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", index, count);
  return buf;
}

}  // namespace crosstrain::train::hf
