#include "crosstrain/data/dataset.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "crosstrain/core/error.h"
#include "crosstrain/data/tokenizer.h"

namespace crosstrain::data {
namespace fs = std::filesystem;

uint16_t TokenStream::max_token() const { return size_ ? *std::max_element(data_, data_ + size_) : 0; }

namespace {

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot read data file '" + path.string() + "': " + std::strerror(errno));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

TokenStream load_text(const fs::path& path, std::string& description) {
  std::vector<fs::path> files;
  if (fs::is_directory(path)) {
    // A folder: its regular text files in name order (index files such as fortune's *.dat are skipped).
    for (const auto& entry : fs::directory_iterator(path)) {
      if (!entry.is_regular_file() || entry.is_symlink()) continue;
      auto ext = entry.path().extension().string();
      if (ext == ".dat" || ext == ".gz" || ext == ".bin") continue;
      files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(path);
  }
  std::string text;
  for (const auto& f : files) text += read_file(f);
  auto tokens = std::make_shared<std::vector<uint16_t>>(ByteTokenizer().encode(text));
  description = std::to_string(text.size()) + " bytes of text from " + std::to_string(files.size()) +
                (files.size() == 1 ? " file" : " files");
  return TokenStream(tokens, tokens->data(), tokens->size());
}

TokenStream load_bin(const fs::path& path, std::string& description) {
  int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) throw UsageError("cannot open token file '" + path.string() + "': " + std::strerror(errno));
  struct stat st {};
  fstat(fd, &st);
  const size_t bytes = static_cast<size_t>(st.st_size);
  if (bytes % 2 != 0) {
    close(fd);
    throw UsageError("token file '" + path.string() + "' has " + std::to_string(bytes) +
                     " bytes, not a whole number of uint16 tokens; is it really a nanoGPT .bin file?");
  }
  if (bytes == 0) {
    close(fd);
    throw UsageError("token file '" + path.string() + "' is empty");
  }
  void* map = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (map == MAP_FAILED) throw UsageError("cannot map token file '" + path.string() + "': " + std::strerror(errno));
  std::shared_ptr<const void> owner(map, [bytes](const void* p) { munmap(const_cast<void*>(p), bytes); });
  description = std::to_string(bytes / 2) + " uint16 tokens from " + path.filename().string();
  return TokenStream(owner, static_cast<const uint16_t*>(map), bytes / 2);
}

}  // namespace

Splits load_dataset(const DatasetConfig& config, int64_t block_size) {
  const fs::path path(config.path);
  if (config.path.empty()) throw UsageError("data.path is not set; point it at a text file, a folder or a .bin file");
  std::error_code ec;
  if (!fs::exists(path, ec))
    throw UsageError("data file '" + config.path + "' does not exist (data.path); for the demo corpus run "
                     "scripts/install-deps.sh, which installs Debian's fortunes package");
  if (config.val_fraction < 0 || config.val_fraction >= 1)
    throw UsageError("data.val_fraction must be in [0, 1), got " + std::to_string(config.val_fraction));
  std::string format = config.format;
  if (format == "auto") format = path.extension() == ".bin" ? "bin" : "text";
  Splits s;
  TokenStream all;
  if (format == "text") all = load_text(path, s.description);
  else if (format == "bin") all = load_bin(path, s.description);
  else throw UsageError("data.format '" + config.format + "' is not one of auto, text, bin");
  const size_t val = static_cast<size_t>(static_cast<double>(all.size()) * config.val_fraction);
  s.train = all.slice(0, all.size() - val);
  s.val = all.slice(all.size() - val, all.size());
  const size_t need = static_cast<size_t>(block_size) + 1;
  if (s.train.size() < need || (config.val_fraction > 0 && s.val.size() < need))
    throw UsageError("data '" + config.path + "' (" + s.description + ") is too small for sequences of " +
                     std::to_string(block_size) + " tokens in both the training and validation parts");
  return s;
}

void make_batch(const TokenStream& stream, const std::vector<int64_t>& offsets, int64_t block_size,
                at::Tensor& inputs, at::Tensor& targets) {
  const auto n = static_cast<int64_t>(offsets.size());
  inputs = at::empty({n, block_size}, at::kLong);
  targets = at::empty({n, block_size}, at::kLong);
  int64_t* x = inputs.data_ptr<int64_t>();
  int64_t* y = targets.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t* src = stream.data() + offsets[static_cast<size_t>(i)];
    for (int64_t t = 0; t < block_size; ++t) {
      x[i * block_size + t] = src[t];
      y[i * block_size + t] = src[t + 1];
    }
  }
}

}  // namespace crosstrain::data
