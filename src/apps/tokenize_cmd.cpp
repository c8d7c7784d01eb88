#include "tokenize_cmd.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

#include "crosstrain/core/error.h"
#include "crosstrain/data/corpus.h"
#include "crosstrain/data/sentencepiece_tokenizer.h"
#include "crosstrain/data/token_file.h"

namespace crosstrain::apps {
namespace fs = std::filesystem;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void check_options(const TokenizeOptions& o) {
  std::error_code ec;
  if (!fs::exists(o.corpus, ec))
    throw UsageError("corpus '" + o.corpus + "' does not exist; give a text file or a folder of text files");
  if (o.out.empty()) throw UsageError("--out is required: the folder to write the token file and tokenizer to");
  if (fs::exists(o.out, ec) && !fs::is_directory(o.out, ec))
    throw UsageError("--out '" + o.out + "' exists and is not a folder");
  if (o.tokenizer.empty() && o.type != "bpe" && o.type != "unigram")
    throw UsageError("--type '" + o.type + "' is not one of bpe, unigram");
  if (o.val_fraction < 0 || o.val_fraction >= 1)
    throw UsageError("--val-fraction must be in [0, 1), got " + std::to_string(o.val_fraction));
}

// The files an existing tokenizer is made of (copied into DIR) and the name meta.json gives it.
std::vector<fs::path> tokenizer_sources(const std::string& path) {
  fs::path p(path);
  std::error_code ec;
  if (fs::is_directory(p, ec))
    for (const char* name : {"tokenizer.model", "tokenizer.json", "vocab.json"})
      if (fs::exists(p / name, ec)) {
        p = p / name;
        break;
      }
  if (p.filename() == "vocab.json") return {p, p.parent_path() / "merges.txt"};
  return {p};
}

std::string file_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot read '" + path.string() + "'");
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

std::unique_ptr<data::Tokenizer> train_tokenizer(const TokenizeOptions& o, const std::string& text, int threads) {
  std::fprintf(stderr, "training a SentencePiece %s model of %lld pieces on %.1f MB of text...\n", o.type.c_str(),
               static_cast<long long>(o.vocab_size), static_cast<double>(text.size()) / 1e6);
  const auto start = Clock::now();
  data::SentencePieceTraining training;
  training.type = o.type;
  training.vocab_size = o.vocab_size;
  training.threads = threads;
  size_t pos = 0;
  auto next_line = [&](std::string& line) {
    if (pos >= text.size()) return false;
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    line.assign(text, pos, end - pos);
    pos = end + 1;
    return true;
  };
  auto tokenizer =
      std::make_unique<data::SentencePieceTokenizer>(data::SentencePieceTokenizer::train(training, next_line));
  std::fprintf(stderr, "trained in %.1f s\n", seconds_since(start));
  return tokenizer;
}

// Encodes `text` with a progress line on a terminal.
std::vector<uint32_t> encode_with_progress(const std::string& text, const data::Tokenizer& tokenizer, int threads,
                                           const char* what) {
  const bool tty = isatty(STDERR_FILENO);
  auto progress = [&](size_t done, size_t total) {
    if (!tty) return;
    const double percent = total ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0;
    std::fprintf(stderr, "\rencoding %s: %3.0f%% of %.1f MB", what, percent, static_cast<double>(total) / 1e6);
  };
  auto ids = data::encode_parallel(text, tokenizer, threads, progress);
  if (tty) std::fprintf(stderr, "\n");
  return ids;
}

// Cuts the text at the line start nearest below (1 - fraction) of its bytes; the second part is validation.
size_t validation_cut(const std::string& text, double fraction) {
  if (fraction <= 0) return text.size();
  const auto target = static_cast<size_t>(static_cast<double>(text.size()) * (1 - fraction));
  const size_t newline = text.rfind('\n', target == 0 ? 0 : target - 1);
  return newline == std::string::npos ? 0 : newline + 1;
}

}  // namespace

int tokenize_command(const TokenizeOptions& o) {
  check_options(o);
  const int threads = o.threads > 0 ? o.threads : std::max(1u, std::thread::hardware_concurrency());
  const std::string text = data::read_corpus(o.corpus);
  if (text.empty()) throw UsageError("corpus '" + o.corpus + "' holds no text");
  const auto tokenizer = o.tokenizer.empty() ? train_tokenizer(o, text, threads) : data::load_tokenizer(o.tokenizer);
  const size_t cut = validation_cut(text, o.val_fraction);
  if (o.val_fraction > 0 && (cut == 0 || cut == text.size()))
    throw UsageError("--val-fraction " + std::to_string(o.val_fraction) + " leaves no whole line for one of the parts");
  const auto start = Clock::now();
  const auto train_ids = cut == text.size() ? encode_with_progress(text, *tokenizer, threads, "train")
                                            : encode_with_progress(text.substr(0, cut), *tokenizer, threads, "train");
  const auto val_ids = cut < text.size() ? encode_with_progress(text.substr(cut), *tokenizer, threads, "val")
                                         : std::vector<uint32_t>();
  const double encode_s = seconds_since(start);

  data::TokenMeta meta;
  meta.vocab_size = tokenizer->vocab_size();
  meta.dtype = data::dtype_for_vocab(meta.vocab_size);
  meta.tokenizer_type = tokenizer->type();
  meta.tokens = train_ids.size() + val_ids.size();
  meta.bytes = text.size();
  meta.corpus = o.corpus;
  // Everything is in memory before the first file is written: bad input has failed by now.
  std::vector<std::pair<fs::path, std::string>> files;
  const fs::path out(o.out);
  if (o.tokenizer.empty()) {
    meta.tokenizer = "tokenizer.model";
    files.emplace_back(out / meta.tokenizer, static_cast<const data::SentencePieceTokenizer&>(*tokenizer).serialized());
  } else {
    const auto sources = tokenizer_sources(o.tokenizer);
    meta.tokenizer = sources[0].extension() == ".model"        ? "tokenizer.model"
                     : sources[0].filename() == "vocab.json" ? "vocab.json"
                                                             : "tokenizer.json";
    files.emplace_back(out / meta.tokenizer, file_bytes(sources[0]));
    if (sources.size() > 1) files.emplace_back(out / sources[1].filename(), file_bytes(sources[1]));
  }
  files.emplace_back(out / meta.train, data::token_file_bytes(train_ids, meta.dtype));
  if (!val_ids.empty()) {
    meta.val = "val.bin";
    files.emplace_back(out / meta.val, data::token_file_bytes(val_ids, meta.dtype));
  }
  files.emplace_back(out / "meta.json", data::token_meta_json(meta));  // last: its presence says the rest is whole
  fs::create_directories(out);
  for (const auto& [path, bytes] : files) data::write_file_atomically(path.string(), bytes);

  const double per_token = static_cast<double>(meta.bytes) / static_cast<double>(std::max<uint64_t>(meta.tokens, 1));
  std::printf("%s: %llu tokens (%s, vocabulary %lld, %s) from %llu bytes: %.3f bytes per token\n", o.out.c_str(),
              static_cast<unsigned long long>(meta.tokens), meta.tokenizer_type.c_str(),
              static_cast<long long>(meta.vocab_size), meta.dtype.c_str(), static_cast<unsigned long long>(meta.bytes),
              per_token);
  std::printf("encoded in %.2f s on %d threads (%.1f MB/s)\n", encode_s, threads,
              static_cast<double>(meta.bytes) / 1e6 / std::max(encode_s, 1e-9));
  for (const auto& [path, bytes] : files) std::printf("wrote %s\n", path.string().c_str());
  std::printf("train on it: data.path = \"%s\", model.vocab_size = %lld\n", (out / meta.train).string().c_str(),
              static_cast<long long>(meta.vocab_size));
  return 0;
}

}  // namespace crosstrain::apps
