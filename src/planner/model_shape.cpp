#include "crosstrain/planner/model_shape.h"

#include <cstdio>

#include "crosstrain/core/error.h"

namespace crosstrain::planner {
namespace {

double d(int64_t v) { return static_cast<double>(v); }

bool is_llama(const ModelShape& m) { return m.arch == models::ModelArch::Llama; }

// Weights of one block's matrices: attention (q, k, v, output) and the MLP (two matrices, three for SwiGLU).
double block_matrix_parameters(const ModelShape& m) {
  const double h = d(m.hidden), kv = d(m.kv_heads_or_heads() * m.head_dim()), f = d(m.ffn_or_default());
  const double attention = h * h + 2 * h * kv + h * h;
  const double mlp = (is_llama(m) ? 3.0 : 2.0) * h * f;
  return attention + mlp;
}

ModelShape gpt(const char* name, int64_t layers, int64_t hidden, int64_t heads, int64_t seq, int64_t vocab, bool tied) {
  ModelShape m;
  m.name = name;
  m.arch = models::ModelArch::Gpt;
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.seq = seq;
  m.vocab = vocab;
  m.tied_embeddings = tied;
  return m;
}

ModelShape llama(const char* name, int64_t layers, int64_t hidden, int64_t heads, int64_t kv_heads, int64_t ffn) {
  ModelShape m;
  m.name = name;
  m.arch = models::ModelArch::Llama;
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.kv_heads = kv_heads;
  m.ffn = ffn;
  m.seq = 4096;
  m.vocab = 32000;
  return m;
}

}  // namespace

double ModelShape::block_parameters() const {
  const double h = d(hidden), kv = d(kv_heads_or_heads() * head_dim()), f = d(ffn_or_default());
  if (is_llama(*this)) return block_matrix_parameters(*this) + 2 * h;  // two RMSNorm weights, no biases
  // GPT: biases on every linear, two LayerNorms (weight and bias).
  return block_matrix_parameters(*this) + (h + 2 * kv + h) + (f + h) + 4 * h;
}

double ModelShape::embedding_parameters() const {
  return d(vocab) * d(hidden) + (is_llama(*this) ? 0.0 : d(seq) * d(hidden));
}

double ModelShape::head_parameters() const { return tied_embeddings ? 0.0 : d(vocab) * d(hidden); }

double ModelShape::parameters() const {
  const double final_norm = is_llama(*this) ? d(hidden) : 2 * d(hidden);
  return d(layers) * block_parameters() + embedding_parameters() + head_parameters() + final_norm;
}

double ModelShape::matmul_parameters() const {
  // The head multiplies every token by the vocabulary matrix whether or not it shares the embedding's storage.
  return d(layers) * block_matrix_parameters(*this) + d(vocab) * d(hidden);
}

double ModelShape::flops_per_token() const {
  return 6.0 * matmul_parameters() + 12.0 * d(layers) * d(seq) * d(hidden);
}

double ModelShape::hardware_flops_per_token(bool full_recompute) const {
  if (!full_recompute) return flops_per_token();
  // One more forward of every block (not of the head): 2 N_block per token plus the attention's 4 s h.
  return flops_per_token() + 2.0 * d(layers) * block_matrix_parameters(*this) + 4.0 * d(layers) * d(seq) * d(hidden);
}

void ModelShape::validate() const {
  auto need = [&](bool ok, const std::string& what) {
    if (!ok) throw UsageError("model '" + name + "': " + what);
  };
  need(arch != models::ModelArch::Dlrm, std::string("arch must be gpt or llama, not '") + models::to_string(arch) + "'");
  need(layers > 0 && hidden > 0 && heads > 0 && vocab > 0 && seq > 0,
       "layers, hidden, heads, vocab and seq must be positive");
  need(hidden % heads == 0, "hidden (" + std::to_string(hidden) + ") must be a multiple of heads (" +
                                std::to_string(heads) + ")");
  need(kv_heads >= 0 && heads % kv_heads_or_heads() == 0,
       "heads (" + std::to_string(heads) + ") must be a multiple of kv_heads (" + std::to_string(kv_heads) + ")");
  need(ffn >= 0, "ffn must be >= 0 (0: 4 x hidden)");
  // Far above any model trained today, and low enough that the planner's counts cannot overflow.
  need(layers <= 100000 && hidden <= (1 << 20) && ffn <= (1 << 22) && vocab <= (1 << 24) && seq <= (1 << 24),
       "layers (at most 100000), hidden (2^20), ffn (2^22), vocab and seq (2^24) are beyond what can be planned");
}

std::string ModelShape::describe() const {
  char buffer[256];
  std::snprintf(buffer, sizeof buffer, "%s: %s, %lld layers, hidden %lld, %lld heads%s, ffn %lld, seq %lld, vocab %lld, %.4g B parameters",
                name.c_str(), models::to_string(arch), static_cast<long long>(layers), static_cast<long long>(hidden),
                static_cast<long long>(heads),
                kv_heads > 0 && kv_heads != heads ? (" (" + std::to_string(kv_heads) + " kv)").c_str() : "",
                static_cast<long long>(ffn_or_default()), static_cast<long long>(seq), static_cast<long long>(vocab),
                parameters() / 1e9);
  return buffer;
}

std::vector<std::string> model_preset_names() {
  return {"gpt-tiny", "gpt-small", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl", "gpt3-175b", "llama-7b", "llama-70b"};
}

ModelShape model_preset(const std::string& name) {
  // GPT-2 ties its head to the token embedding; GPT-3 175B is Megatron's shape (vocabulary padded to 51200).
  if (name == "gpt-tiny") return gpt("gpt-tiny", 4, 128, 4, 128, 256, false);
  if (name == "gpt-small") return gpt("gpt-small", 6, 384, 6, 256, 256, false);
  if (name == "gpt2") return gpt("gpt2", 12, 768, 12, 1024, 50257, true);
  if (name == "gpt2-medium") return gpt("gpt2-medium", 24, 1024, 16, 1024, 50257, true);
  if (name == "gpt2-large") return gpt("gpt2-large", 36, 1280, 20, 1024, 50257, true);
  if (name == "gpt2-xl") return gpt("gpt2-xl", 48, 1600, 25, 1024, 50257, true);
  if (name == "gpt3-175b") return gpt("gpt3-175b", 96, 12288, 96, 2048, 51200, true);
  if (name == "llama-7b") return llama("llama-7b", 32, 4096, 32, 0, 11008);
  if (name == "llama-70b") return llama("llama-70b", 80, 8192, 64, 8, 28672);
  std::string names;
  for (const auto& n : model_preset_names()) names += (names.empty() ? "" : ", ") + n;
  throw UsageError("unknown model '" + name + "': give a recipe (.toml) or one of " + names);
}

ModelShape from_gpt_config(const models::GPTConfig& config, const std::string& name) {
  ModelShape m = gpt(name.c_str(), config.n_layer, config.n_embd, config.n_head, config.block_size,
                     config.vocab_size, false);
  if (config.is_llama()) {  // the trainer's Llama family: the same shape fields the llama presets set
    m.arch = models::ModelArch::Llama;
    m.kv_heads = config.kv_heads();
    m.ffn = config.mlp_hidden();
    m.tied_embeddings = config.tie_embeddings;
  }
  return m;
}

}  // namespace crosstrain::planner
