#include "crosstrain/data/bpe_tokenizer.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "crosstrain/core/error.h"

namespace crosstrain::data {

namespace {

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// Bytes in a UTF-8 sequence that starts with `lead`, if the rest of `s` holds them; else 1 (a stray byte).
size_t char_length(const std::string& s, size_t i) {
  const auto lead = static_cast<unsigned char>(s[i]);
  size_t n = lead < 0x80 ? 1 : lead >= 0xF0 && lead <= 0xF4 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC2 ? 2 : 1;
  if (n == 1 || i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  return n;
}

enum class CharClass { kLetter, kDigit, kSpace, kOther };

CharClass class_at(const std::string& s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c >= 0x80) return CharClass::kLetter;  // non-ASCII: see pretokenize's comment in the header
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return CharClass::kLetter;
  if (c >= '0' && c <= '9') return CharClass::kDigit;
  if (c == ' ' || (c >= '\t' && c <= '\r')) return CharClass::kSpace;
  return CharClass::kOther;
}

// Length of the contraction ('s 't 're 've 'm 'll 'd) at i, or 0.
size_t contraction_at(const std::string& s, size_t i) {
  if (s[i] != '\'' || i + 1 >= s.size()) return 0;
  const char a = s[i + 1], b = i + 2 < s.size() ? s[i + 2] : '\0';
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// End of the run of characters of class c from i.
size_t run_end(const std::string& s, size_t i, CharClass c) {
  while (i < s.size() && class_at(s, i) == c) i += char_length(s, i);
  return i;
}

std::string read_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot read " + what + " '" + path + "'");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

nlohmann::json parse_json(const std::string& path, const std::string& what) {
  try {
    return nlohmann::json::parse(read_file(path, what));
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(what + " '" + path + "' is not valid JSON: " + e.what());
  }
}

// Token ids beyond this are refused: tables are indexed by id (a file claiming id 2^62 asked for exabytes), and
// the largest vocabularies in use are a few hundred thousand tokens.
constexpr uint64_t kMaxTokenId = uint64_t{1} << 24;

std::unordered_map<std::string, uint32_t> vocab_of(const nlohmann::json& j, const std::string& origin) {
  if (!j.is_object()) throw UsageError(origin + ": the vocabulary is not a JSON object of token -> id");
  std::unordered_map<std::string, uint32_t> vocab;
  for (const auto& [token, id] : j.items()) {
    if (!id.is_number_unsigned() || id.get<uint64_t>() >= kMaxTokenId)
      throw UsageError(origin + ": token '" + token.substr(0, 64) + "' has id " + id.dump() +
                       ", not an id in 0..2^24-1");
    vocab.emplace(token, id.get<uint32_t>());
  }
  return vocab;
}

std::pair<std::string, std::string> split_merge(const std::string& line, const std::string& origin) {
  const auto space = line.find(' ', 1);
  if (space == std::string::npos || space + 1 >= line.size())
    throw UsageError(origin + ": merge '" + line + "' is not two tokens separated by a space");
  return {line.substr(0, space), line.substr(space + 1)};
}

}  // namespace

const std::array<std::string, 256>& bytes_to_unicode() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      t[b] = utf8(printable ? b : next++);
    }
    return t;
  }();
  return table;
}

std::vector<std::string> pretokenize(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    if (const size_t n = contraction_at(s, i)) {
      out.push_back(s.substr(i, n));
      i += n;
      continue;
    }
    // " ?X+" for letters, digits and other: an optional leading space, then a run of one class.
    const size_t start = i;
    size_t j = i;
    if (s[i] == ' ' && i + 1 < s.size() && class_at(s, i + 1) != CharClass::kSpace) j = i + 1;
    const CharClass c = class_at(s, j);
    if (c != CharClass::kSpace) {
      i = run_end(s, j, c);
      out.push_back(s.substr(start, i - start));
      continue;
    }
    // "\s+(?!\S)|\s+": whitespace up to the end, or all but the last character before a non-space (which then
    // leads the next piece when it is ' '); a single whitespace character before a non-space stands alone.
    const size_t end = run_end(s, i, CharClass::kSpace);
    i = end == s.size() || end - i == 1 ? end : end - 1;
    out.push_back(s.substr(start, i - start));
  }
  return out;
}

BpeTokenizer::BpeTokenizer(std::unordered_map<std::string, uint32_t> vocab,
                           const std::vector<std::pair<std::string, std::string>>& merges,
                           const std::unordered_map<std::string, uint32_t>& added, const std::string& origin)
    : origin_(origin) {
  for (const auto& [token, id] : vocab) vocab_size_ = std::max<int64_t>(vocab_size_, int64_t{id} + 1);
  for (const auto& [token, id] : added) vocab_size_ = std::max<int64_t>(vocab_size_, int64_t{id} + 1);
  pieces_.assign(static_cast<size_t>(vocab_size_), std::string());
  std::unordered_map<std::string, unsigned char> byte_of;
  const auto& table = bytes_to_unicode();
  for (int b = 0; b < 256; ++b) byte_of[table[static_cast<size_t>(b)]] = static_cast<unsigned char>(b);
  for (const auto& [token, id] : vocab) {
    std::string& bytes = pieces_[id];
    for (size_t i = 0; i < token.size();) {
      const size_t n = char_length(token, i);
      const auto it = byte_of.find(token.substr(i, n));
      if (it != byte_of.end()) bytes += static_cast<char>(it->second);
      else bytes += token.substr(i, n);  // not a byte-level character: kept as written
      i += n;
    }
  }
  for (const auto& [content, id] : added) pieces_[id] = content;
  byte_ids_.fill(kNone);
  for (int b = 0; b < 256; ++b) {
    const auto it = vocab.find(table[static_cast<size_t>(b)]);
    if (it != vocab.end()) byte_ids_[static_cast<size_t>(b)] = it->second;
  }
  auto id_of = [&](const std::string& token, size_t rank) {
    const auto it = vocab.find(token);
    if (it == vocab.end())
      throw UsageError(origin + ": merge " + std::to_string(rank) + " names '" + token +
                       "', which is not in the vocabulary; is this a byte-level BPE tokenizer?");
    return it->second;
  };
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const uint64_t key = (uint64_t{id_of(left, rank)} << 32) | id_of(right, rank);
    merges_.emplace(key, std::make_pair(static_cast<uint32_t>(rank), id_of(left + right, rank)));
  }
}

BpeTokenizer BpeTokenizer::from_tokenizer_json(const std::string& path) {
  const auto j = parse_json(path, "tokenizer file");
  const std::string origin = "tokenizer file '" + path + "'";
  if (!j.contains("model") || !j["model"].contains("vocab") || !j["model"].contains("merges"))
    throw UsageError(origin + " has no model.vocab and model.merges; is it a Hugging Face tokenizer.json?");
  const auto& model = j["model"];
  if (model.contains("type") && model["type"] != "BPE")
    throw UsageError(origin + " holds a " + model["type"].dump() + " model; only (byte-level) BPE is read");
  std::vector<std::pair<std::string, std::string>> merges;
  for (const auto& m : model["merges"]) {
    if (m.is_string()) merges.push_back(split_merge(m.get<std::string>(), origin));
    else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string())
      merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    else throw UsageError(origin + ": merge " + m.dump() + " is neither \"a b\" nor [\"a\", \"b\"]");
  }
  std::unordered_map<std::string, uint32_t> added;
  if (j.contains("added_tokens") && j["added_tokens"].is_array())
    for (const auto& t : j["added_tokens"])
      if (t.is_object() && t.contains("content") && t["content"].is_string() && t.contains("id") &&
          t["id"].is_number_unsigned()) {
        if (t["id"].get<uint64_t>() >= kMaxTokenId)
          throw UsageError(origin + ": added token id " + t["id"].dump() + " is not an id in 0..2^24-1");
        added.emplace(t["content"].get<std::string>(), t["id"].get<uint32_t>());
      }
  return BpeTokenizer(vocab_of(model["vocab"], origin), merges, added, origin);
}

BpeTokenizer BpeTokenizer::from_vocab_merges(const std::string& vocab_json, const std::string& merges_txt) {
  const auto vocab = vocab_of(parse_json(vocab_json, "vocabulary file"), "vocabulary file '" + vocab_json + "'");
  const std::string origin = "merges file '" + merges_txt + "'";
  std::istringstream lines(read_file(merges_txt, "merges file"));
  std::vector<std::pair<std::string, std::string>> merges;
  std::string line;
  while (std::getline(lines, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;  // GPT-2's file opens with "#version: 0.2"
    merges.push_back(split_merge(line, origin));
  }
  return BpeTokenizer(vocab, merges, {}, "tokenizer '" + vocab_json + "' + '" + merges_txt + "'");
}

void BpeTokenizer::encode_piece(const std::string& piece, std::vector<uint32_t>& out) const {
  std::vector<uint32_t> symbols;
  symbols.reserve(piece.size());
  for (unsigned char b : piece) {
    if (byte_ids_[b] == kNone) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02X", b);
      throw UsageError(origin_ + " has no token for the byte " + hex + ", so it cannot encode this text");
    }
    symbols.push_back(byte_ids_[b]);
  }
  // Merge the adjacent pair of lowest rank, at every place it occurs (left to right), until none has a merge.
  while (symbols.size() > 1) {
    uint32_t best_rank = kNone, merged = kNone;
    uint64_t best_key = 0;
    for (size_t k = 0; k + 1 < symbols.size(); ++k) {
      const uint64_t key = (uint64_t{symbols[k]} << 32) | symbols[k + 1];
      const auto it = merges_.find(key);
      if (it != merges_.end() && it->second.first < best_rank) {
        best_rank = it->second.first;
        merged = it->second.second;
        best_key = key;
      }
    }
    if (best_rank == kNone) break;
    size_t w = 0;
    for (size_t k = 0; k < symbols.size(); ++k, ++w) {
      if (k + 1 < symbols.size() && ((uint64_t{symbols[k]} << 32) | symbols[k + 1]) == best_key) {
        symbols[w] = merged;
        ++k;
      } else {
        symbols[w] = symbols[k];
      }
    }
    symbols.resize(w);
  }
  out.insert(out.end(), symbols.begin(), symbols.end());
}

std::vector<uint32_t> BpeTokenizer::encode(const std::string& text) const {
  std::vector<uint32_t> out;
  out.reserve(text.size() / 3);
  // Words repeat: each distinct pre-token is merged once per call.
  std::unordered_map<std::string, std::pair<size_t, size_t>> seen;  // piece -> (start, length) in `out`
  for (const std::string& piece : pretokenize(text)) {
    const auto it = seen.find(piece);
    if (it != seen.end()) {
      const size_t start = it->second.first, n = it->second.second;
      for (size_t k = 0; k < n; ++k) {
        const uint32_t id = out[start + k];  // read before push_back may move `out`
        out.push_back(id);
      }
      continue;
    }
    const size_t start = out.size();
    encode_piece(piece, out);
    seen.emplace(piece, std::make_pair(start, out.size() - start));
  }
  return out;
}

std::string BpeTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string out;
  for (int64_t id : ids) {
    const bool known = id >= 0 && id < vocab_size_ && !pieces_[static_cast<size_t>(id)].empty();
    out += known ? pieces_[static_cast<size_t>(id)] : "<" + std::to_string(id) + ">";
  }
  return out;
}

}  // namespace crosstrain::data
