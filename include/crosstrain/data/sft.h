// Prompt/response pairs for supervised fine-tuning, from a JSONL file (data.format = "jsonl", or a .jsonl path).
//
// Each non-blank line is an object {"prompt": "...", "response": "..."} (other keys are ignored). An example is
// its prompt's tokens, then its response's tokens, then the end-of-text token, each string tokenized on its own
// (a subword tokenizer never merges across the boundary). Examples are packed one after another into one token
// stream, with a LossMask beside it (loss_mask.h): targets predicting response tokens and the end-of-text token
// are trained; targets predicting prompt tokens, and the one crossing into the next example, are not. Attention
// is not masked: a sequence may see the end of the example before its own (as with any packed data).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "crosstrain/data/dataset.h"
#include "crosstrain/data/loss_mask.h"

namespace crosstrain::data {

struct PackedExamples {
  std::vector<uint32_t> tokens;
  std::vector<uint8_t> flags;   // per token, LossMask's kTrained / kExampleStart
  std::vector<size_t> starts;   // the first token of each example, ascending
  size_t longest = 0;           // tokens of the longest example
};

using Encoder = std::function<std::vector<uint32_t>(const std::string&)>;

// Reads and packs `path`. Throws UsageError naming the file and line for a line that is not a JSON object with
// string "prompt" and "response", and for a file without examples.
PackedExamples pack_jsonl(const std::string& path, const Encoder& encode, uint32_t eos_token);

// data.format is "jsonl", or "auto" with a path ending in .jsonl.
bool is_jsonl(const DatasetConfig& config);

// The end-of-text token data.eos_token names, or for byte-level data (no data.tokenizer) byte 0 (NUL), which
// text does not hold. A subword tokenizer's end-of-text id differs between vocabularies: data.eos_token must
// name it (UsageError otherwise).
uint32_t eos_token(const DatasetConfig& config);

// load_dataset for format "jsonl": packs config.path with the tokenizer config.tokenizer names (bytes when
// none) and splits by whole examples, the last val_fraction of them for validation. Fills s.train, s.val,
// s.train_mask, s.val_mask, s.description, s.vocab_size (the tokenizer's), s.tokenizer and, when an example
// is longer than block_size + 1 tokens (only a window starting at its first token trains it), s.warning.
void load_jsonl(const DatasetConfig& config, int64_t block_size, Splits& s);

}  // namespace crosstrain::data
