// A text corpus (a file, or a folder of text files as data.path takes it) and its parallel encoding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "crosstrain/data/tokenizer.h"

namespace crosstrain::data {

// The files a text source is made of: the file itself, or a folder's regular files in name order, without
// symbolic links, fortune's index files (*.dat) and compressed or token files (*.gz, *.bin).
std::vector<std::string> corpus_files(const std::string& path);

// The files' text, one after another. Throws UsageError naming a file that cannot be read.
std::string read_corpus(const std::string& path);

// Encodes `text` in chunks of about `chunk_bytes` cut at line starts, on `threads` threads, and joins the chunks'
// ids in order. The chunks do not depend on `threads`, so neither do the ids. `progress(done, total)` (bytes) is
// called from the calling thread as chunks finish; it may be empty. An exception in a chunk is rethrown here.
std::vector<uint32_t> encode_parallel(const std::string& text, const Tokenizer& tokenizer, int threads,
                                      const std::function<void(size_t, size_t)>& progress,
                                      size_t chunk_bytes = size_t{1} << 18);

}  // namespace crosstrain::data
