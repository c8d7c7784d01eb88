#include "crosstrain/data/corpus.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "crosstrain/core/error.h"

namespace crosstrain::data {
namespace fs = std::filesystem;

std::vector<std::string> corpus_files(const std::string& path) {
  if (!fs::is_directory(path)) return {path};
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(path)) {
    if (!entry.is_regular_file() || entry.is_symlink()) continue;
    const auto ext = entry.path().extension().string();
    if (ext == ".dat" || ext == ".gz" || ext == ".bin") continue;
    files.push_back(entry.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::string read_corpus(const std::string& path) {
  std::string text;
  for (const auto& file : corpus_files(path)) {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw UsageError("cannot read text file '" + file + "': " + std::strerror(errno));
    std::ostringstream bytes;
    bytes << in.rdbuf();
    text += bytes.str();
  }
  return text;
}

namespace {

// Chunk starts: every `chunk_bytes`, moved forward to the next line start; the last entry is text.size().
std::vector<size_t> chunk_starts(const std::string& text, size_t chunk_bytes) {
  std::vector<size_t> starts{0};
  while (starts.back() < text.size()) {
    size_t next = starts.back() + std::max<size_t>(chunk_bytes, 1);
    if (next >= text.size()) break;
    next = text.find('\n', next);
    if (next == std::string::npos) break;
    starts.push_back(next + 1);
  }
  if (starts.back() != text.size()) starts.push_back(text.size());
  return starts;
}

}  // namespace

std::vector<uint32_t> encode_parallel(const std::string& text, const Tokenizer& tokenizer, int threads,
                                      const std::function<void(size_t, size_t)>& progress, size_t chunk_bytes) {
  const std::vector<size_t> starts = chunk_starts(text, chunk_bytes);
  const size_t chunks = starts.size() - 1;
  std::vector<std::vector<uint32_t>> ids(chunks);
  std::vector<std::exception_ptr> errors(chunks);
  std::atomic<size_t> next{0};
  std::mutex mutex;
  std::condition_variable finished;
  size_t done_bytes = 0, done_chunks = 0;
  auto work = [&] {
    for (size_t c = next++; c < chunks; c = next++) {
      try {
        ids[c] = tokenizer.encode(text.substr(starts[c], starts[c + 1] - starts[c]));
      } catch (...) {
        errors[c] = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex);
      done_bytes += starts[c + 1] - starts[c];
      ++done_chunks;
      finished.notify_one();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < std::max(1, std::min<int>(threads, static_cast<int>(chunks))); ++t) pool.emplace_back(work);
  {
    std::unique_lock<std::mutex> lock(mutex);
    for (size_t seen = 0; seen < chunks;) {
      finished.wait(lock, [&] { return done_chunks > seen; });
      seen = done_chunks;
      if (progress) progress(done_bytes, text.size());
    }
  }
  for (auto& t : pool) t.join();
  for (const auto& e : errors)
    if (e) std::rethrow_exception(e);
  size_t total = 0;
  for (const auto& v : ids) total += v.size();
  std::vector<uint32_t> out;
  out.reserve(total);
  for (auto& v : ids) {
    out.insert(out.end(), v.begin(), v.end());
    std::vector<uint32_t>().swap(v);
  }
  return out;
}

}  // namespace crosstrain::data
