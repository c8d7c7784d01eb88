// The safetensors format (Hugging Face): an 8-byte little-endian header length, a JSON header mapping each
// name to {dtype, shape, data_offsets}, then the raw little-endian bytes. Readable from Python and Rust.
#pragma once

#include <ATen/core/Tensor.h>

#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace crosstrain::checkpoint {

struct NamedTensor {
  std::string name;
  at::Tensor tensor;  // CPU, any layout (written contiguous)
};

// Writes `path` (not atomically: callers write into a temporary directory). Throws Error on I/O failure.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

struct SafetensorsFile {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Reads the header (validated: dtypes, shapes, offsets inside the file) and then only the tensors asked for.
// Throws UsageError naming the file and the problem when it is missing, truncated or malformed.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  std::vector<std::string> names() const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool has(const std::string& name) const { return entries_.count(name) > 0; }
  // Elements of a tensor, from the header (the constructor checked that its bytes lie inside the file).
  int64_t numel(const std::string& name) const;
  // Shape and dtype from the header, without reading the data.
  std::vector<int64_t> shape(const std::string& name) const;
  at::ScalarType dtype(const std::string& name) const;
  at::Tensor read(const std::string& name);

 private:
  struct Entry {
    at::ScalarType dtype = at::kFloat;
    std::vector<int64_t> shape;
    int64_t offset = 0, bytes = 0;
  };
  std::string path_;
  std::ifstream in_;
  int64_t data_start_ = 0;
  std::map<std::string, Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

// Reads and validates (header, dtypes, shapes, offsets inside the file). Throws UsageError naming the file
// and the problem when it is missing, truncated or malformed.
SafetensorsFile read_safetensors(const std::string& path);

}  // namespace crosstrain::checkpoint
