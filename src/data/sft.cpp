#include "crosstrain/data/sft.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include "crosstrain/core/error.h"
#include "crosstrain/data/tokenizer.h"

namespace crosstrain::data {

namespace {

std::string where(const std::string& path, size_t line) { return path + ":" + std::to_string(line); }

// The string value of `key`, or a UsageError naming the file and line.
const std::string& string_field(const nlohmann::json& j, const char* key, const std::string& path, size_t line) {
  const auto it = j.find(key);
  if (it == j.end())
    throw UsageError(where(path, line) + ": no \"" + key + "\" key; each line must be an object like "
                     "{\"prompt\": \"...\", \"response\": \"...\"}");
  if (!it->is_string())
    throw UsageError(where(path, line) + ": \"" + key + "\" is a " + it->type_name() + ", not a string");
  return it->get_ref<const std::string&>();
}

nlohmann::json parse_line(const std::string& text, const std::string& path, size_t line) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw UsageError(where(path, line) + ": not valid JSON (at byte " + std::to_string(e.byte) +
                     " of the line); each line must be one object like {\"prompt\": \"...\", \"response\": \"...\"}");
  }
  if (!j.is_object())
    throw UsageError(where(path, line) + ": a JSON " + std::string(j.type_name()) + ", not an object with "
                     "\"prompt\" and \"response\"");
  return j;
}

void append_example(PackedExamples& p, const std::vector<uint32_t>& prompt, const std::vector<uint32_t>& response,
                    uint32_t eos) {
  const size_t start = p.tokens.size();
  p.starts.push_back(start);
  p.tokens.insert(p.tokens.end(), prompt.begin(), prompt.end());
  p.flags.insert(p.flags.end(), prompt.size(), 0);
  p.tokens.insert(p.tokens.end(), response.begin(), response.end());
  p.flags.insert(p.flags.end(), response.size(), LossMask::kTrained);
  p.tokens.push_back(eos);
  p.flags.push_back(LossMask::kTrained);
  // Its first token is predicted from the previous example: never trained, even with an empty prompt.
  p.flags[start] = LossMask::kExampleStart;
  p.longest = std::max(p.longest, p.tokens.size() - start);
}

}  // namespace

PackedExamples pack_jsonl(const std::string& path, const Encoder& encode, uint32_t eos_token) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw UsageError("data.path '" + path + "' is a folder; JSONL prompt/response data must be one file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot read data file '" + path + "': " + std::strerror(errno));
  PackedExamples p;
  std::string text;
  for (size_t line = 1; std::getline(in, text); ++line) {
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.find_first_not_of(" \t") == std::string::npos) continue;  // blank lines separate nothing
    const nlohmann::json j = parse_line(text, path, line);
    const std::string& prompt = string_field(j, "prompt", path, line);
    const std::string& response = string_field(j, "response", path, line);
    append_example(p, encode(prompt), encode(response), eos_token);
  }
  if (in.bad()) throw UsageError("cannot read data file '" + path + "': " + std::strerror(errno));
  if (p.starts.empty())
    throw UsageError("data file '" + path + "' holds no examples; each line must be an object like "
                     "{\"prompt\": \"...\", \"response\": \"...\"}");
  return p;
}

bool is_jsonl(const DatasetConfig& config) {
  return config.format == "jsonl" ||
         (config.format == "auto" && std::filesystem::path(config.path).extension() == ".jsonl");
}

uint32_t eos_token(const DatasetConfig& config) {
  if (config.eos_token >= 0) return static_cast<uint32_t>(config.eos_token);
  if (!config.tokenizer.empty())
    throw UsageError("data.tokenizer is set but data.eos_token is not: name the tokenizer's end-of-text id (e.g. "
                     "50256 for GPT-2's <|endoftext|>; a SentencePiece model's </s>, often 2)");
  return 0;
}

namespace {

Encoder make_encoder(const DatasetConfig& config, int64_t& vocab_size) {
  if (config.tokenizer.empty()) {
    vocab_size = ByteTokenizer::kVocabSize;
    return [](const std::string& text) {
      const std::vector<uint16_t> bytes = ByteTokenizer().encode(text);
      return std::vector<uint32_t>(bytes.begin(), bytes.end());
    };
  }
  std::shared_ptr<const Tokenizer> tokenizer = load_tokenizer(config.tokenizer);
  vocab_size = tokenizer->vocab_size();
  return [tokenizer](const std::string& text) { return tokenizer->encode(text); };
}

}  // namespace

void load_jsonl(const DatasetConfig& config, int64_t block_size, Splits& s) {
  int64_t vocab_size = 0;
  const Encoder encode = make_encoder(config, vocab_size);
  auto packed = std::make_shared<PackedExamples>(pack_jsonl(config.path, encode, eos_token(config)));
  const size_t examples = packed->starts.size();
  const auto val_examples = static_cast<size_t>(static_cast<double>(examples) * config.val_fraction);
  const size_t cut = val_examples > 0 ? packed->starts[examples - val_examples] : packed->tokens.size();
  const size_t n = packed->tokens.size();
  // The stream and the mask share the packed examples' lifetime.
  std::shared_ptr<const std::vector<uint8_t>> flags(packed, &packed->flags);
  const TokenStream all(packed, packed->tokens.data(), n);
  const LossMask mask(flags);
  s.train = all.slice(0, cut);
  s.val = all.slice(cut, n);
  s.train_mask = mask.slice(0, cut);
  s.val_mask = mask.slice(cut, n);
  s.vocab_size = vocab_size;
  s.tokenizer = config.tokenizer;
  s.description = std::to_string(examples) + " prompt/response examples (" + std::to_string(n) + " tokens, " +
                  std::to_string(val_examples) + " examples for validation) from " + config.path;
  if (packed->longest > static_cast<size_t>(block_size) + 1)
    s.warning = "data '" + config.path + "' holds an example of " + std::to_string(packed->longest) +
                " tokens, longer than model.block_size + 1 = " + std::to_string(block_size + 1) +
                ": only its first tokens are trained, and only when a sequence starts exactly at it; raise "
                "model.block_size or shorten the examples";
}

}  // namespace crosstrain::data
