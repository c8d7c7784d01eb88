#include "crosstrain/data/token_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "crosstrain/core/error.h"

namespace crosstrain::data {
namespace fs = std::filesystem;

std::string dtype_for_vocab(int64_t vocab_size) { return vocab_size <= 65536 ? "uint16" : "uint32"; }

int bytes_per_token(const std::string& dtype) {
  if (dtype == "uint16") return 2;
  if (dtype == "uint32") return 4;
  throw UsageError("token dtype '" + dtype + "' is not one of uint16, uint32");
}

namespace {

template <typename T>
T field(const nlohmann::json& j, const char* key, const T& fallback, const std::string& file) {
  if (!j.contains(key)) return fallback;
  try {
    return j.at(key).get<T>();
  } catch (const nlohmann::json::exception&) {
    throw UsageError("'" + file + "': \"" + key + "\" is " + j.at(key).dump() + ", which has the wrong type");
  }
}

}  // namespace

std::optional<TokenMeta> read_token_meta(const std::string& folder) {
  const fs::path path = fs::path(folder.empty() ? "." : folder) / "meta.json";
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return std::nullopt;
  std::ifstream in(path);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError("'" + path.string() + "' beside the token file is not valid JSON (" + e.what() +
                     "); fix or remove it");
  }
  if (!j.is_object() || !j.contains("dtype")) return std::nullopt;  // someone else's meta.json
  const std::string file = path.string();
  TokenMeta m;
  m.dtype = field<std::string>(j, "dtype", m.dtype, file);
  if (m.dtype != "uint16" && m.dtype != "uint32")
    throw UsageError("'" + file + "': dtype \"" + m.dtype + "\" is not one of uint16, uint32");
  m.vocab_size = field<int64_t>(j, "vocab_size", 0, file);
  m.tokenizer = field<std::string>(j, "tokenizer", "", file);
  m.tokenizer_type = field<std::string>(j, "tokenizer_type", "", file);
  m.train = field<std::string>(j, "train", m.train, file);
  m.val = field<std::string>(j, "val", "", file);
  m.tokens = field<uint64_t>(j, "tokens", 0, file);
  m.bytes = field<uint64_t>(j, "bytes", 0, file);
  m.corpus = field<std::string>(j, "corpus", "", file);
  return m;
}

std::string token_meta_json(const TokenMeta& m) {
  nlohmann::ordered_json j;
  j["vocab_size"] = m.vocab_size;
  j["dtype"] = m.dtype;
  j["tokenizer"] = m.tokenizer;
  j["tokenizer_type"] = m.tokenizer_type;
  j["train"] = m.train;
  if (!m.val.empty()) j["val"] = m.val;
  j["tokens"] = m.tokens;
  j["bytes"] = m.bytes;
  j["bytes_per_token"] = m.tokens ? static_cast<double>(m.bytes) / static_cast<double>(m.tokens) : 0.0;
  j["corpus"] = m.corpus;
  return j.dump(2) + "\n";
}

std::string token_file_bytes(const std::vector<uint32_t>& tokens, const std::string& dtype) {
  const int width = bytes_per_token(dtype);
  std::string out(tokens.size() * static_cast<size_t>(width), '\0');
  auto* p = reinterpret_cast<unsigned char*>(out.data());
  for (uint32_t t : tokens) {
    if (width == 2 && t > 0xFFFF)
      throw UsageError("token id " + std::to_string(t) + " does not fit a uint16 token file; use uint32");
    for (int b = 0; b < width; ++b) *p++ = static_cast<unsigned char>(t >> (8 * b));  // little-endian
  }
  return out;
}

void write_file_atomically(const std::string& path, const std::string& bytes) {
  const std::string temp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    out.flush();
    if (!out) {
      const std::string why = std::strerror(errno);
      std::remove(temp.c_str());
      throw Error("cannot write '" + temp + "': " + why);
    }
  }
  std::error_code ec;
  fs::rename(temp, path, ec);
  if (ec) {
    std::remove(temp.c_str());
    throw Error("cannot rename '" + temp + "' to '" + path + "': " + ec.message());
  }
}

}  // namespace crosstrain::data
