// `crosstrain tokenize CORPUS --out DIR`: trains a SentencePiece model on a text corpus (or takes an existing
// tokenizer), encodes the corpus in parallel and writes DIR/train.bin (nanoGPT's layout, uint16 or uint32),
// the tokenizer and DIR/meta.json, which the trainer reads beside the token file (docs/tokenization.md).
#pragma once

#include <cstdint>
#include <string>

namespace crosstrain::apps {

struct TokenizeOptions {
  std::string corpus;      // text file or folder of text files, as data.path takes them
  std::string out;         // folder to write
  int64_t vocab_size = 4096;
  std::string type = "bpe";  // SentencePiece model type: bpe or unigram
  std::string tokenizer;   // an existing tokenizer instead of training one (load_tokenizer's paths)
  int threads = 0;         // 0: one per core
  double val_fraction = 0; // > 0: the last lines of the corpus go to DIR/val.bin
};

// Prints progress on stderr and a summary (tokens, bytes per token, files) on stdout. Throws UsageError on bad
// input before anything is written; every file is written to a temporary name and renamed, meta.json last.
int tokenize_command(const TokenizeOptions& options);

}  // namespace crosstrain::apps
