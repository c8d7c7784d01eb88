// The safetensors format (Hugging Face): an 8-byte little-endian header length, a JSON header mapping each
// name to {dtype, shape, data_offsets}, then the raw little-endian bytes. Readable from Python and Rust.
#pragma once

#include <ATen/core/Tensor.h>

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

// Reads and validates (header, dtypes, shapes, offsets inside the file). Throws UsageError naming the file
// and the problem when it is missing, truncated or malformed.
SafetensorsFile read_safetensors(const std::string& path);

}  // namespace crosstrain::checkpoint
