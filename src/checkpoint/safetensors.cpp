#include "crosstrain/checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <fstream>

#include "crosstrain/core/error.h"

namespace crosstrain::checkpoint {
namespace {

const std::map<at::ScalarType, std::string>& dtype_names() {
  static const std::map<at::ScalarType, std::string> names{
      {at::kFloat, "F32"}, {at::kDouble, "F64"}, {at::kHalf, "F16"}, {at::kBFloat16, "BF16"},
      {at::kChar, "I8"},   {at::kByte, "U8"},    {at::kShort, "I16"}, {at::kInt, "I32"},
      {at::kLong, "I64"},  {at::kBool, "BOOL"}};
  return names;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::vector<at::Tensor> data;
  int64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    auto it = dtype_names().find(tensor.scalar_type());
    if (it == dtype_names().end())
      throw Error("safetensors: tensor '" + name + "' has unsupported dtype " + c10::toString(tensor.scalar_type()));
    at::Tensor t = tensor.detach().contiguous();
    const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
    header[name] = {{"dtype", it->second}, {"shape", t.sizes().vec()}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    data.push_back(t);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // align the data to 8 bytes
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  uint64_t n = text.size();
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& t : data)
    out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * t.element_size()));
  out.flush();
  if (!out) throw Error("cannot write '" + path + "': " + std::strerror(errno));
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path), in_(path, std::ios::binary | std::ios::ate) {
  if (!in_) throw UsageError("cannot open '" + path + "': " + std::strerror(errno));
  const int64_t file_size = static_cast<int64_t>(in_.tellg());
  in_.seekg(0);
  auto bad = [&](const std::string& why) { return UsageError("'" + path + "' is not a valid safetensors file: " + why); };
  if (file_size < 8) throw bad("only " + std::to_string(file_size) + " bytes (truncated?)");
  unsigned char len[8];
  in_.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(len[i]) << (8 * i);
  if (n > static_cast<uint64_t>(file_size - 8)) throw bad("the header claims " + std::to_string(n) + " bytes but the file is shorter (truncated?)");
  std::string text(n, '\0');
  in_.read(text.data(), static_cast<std::streamsize>(n));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("header is not JSON (") + e.what() + ")");
  }
  if (!header.is_object()) throw bad("header is not a JSON object");
  data_start_ = 8 + static_cast<int64_t>(n);
  const int64_t data_size = file_size - data_start_;
  try {
    for (auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        for (auto& [k, v] : entry.items()) metadata_[k] = v.is_string() ? v.get<std::string>() : v.dump();
        continue;
      }
      Entry e;
      bool known = false;
      const std::string dtype_name = entry.value("dtype", "");
      for (const auto& [type, tname] : dtype_names())
        if (tname == dtype_name) e.dtype = type, known = true;
      if (!known) throw bad("tensor '" + name + "' has unknown dtype '" + dtype_name + "'");
      e.shape = entry.at("shape").get<std::vector<int64_t>>();
      auto offsets = entry.at("data_offsets").get<std::vector<int64_t>>();
      int64_t numel = 1;
      for (int64_t d : e.shape) {
        if (d < 0) throw bad("tensor '" + name + "' has a negative dimension");
        numel *= d;
      }
      const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(e.dtype));
      if (offsets.size() != 2 || offsets[0] < 0 || offsets[1] - offsets[0] != bytes)
        throw bad("tensor '" + name + "' has data_offsets that do not match its shape and dtype");
      if (offsets[1] > data_size)
        throw bad("tensor '" + name + "' ends at byte " + std::to_string(offsets[1]) + " of the data but only " +
                  std::to_string(data_size) + " are there (truncated?)");
      e.offset = offsets[0];
      e.bytes = bytes;
      entries_[name] = e;
    }
  } catch (const nlohmann::json::exception& e) {
    throw bad(std::string("malformed header entry (") + e.what() + ")");
  }
}

std::vector<std::string> SafetensorsReader::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

int64_t SafetensorsReader::numel(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw UsageError("'" + path_ + "' has no tensor '" + name + "'");
  return it->second.bytes / static_cast<int64_t>(c10::elementSize(it->second.dtype));
}

std::vector<int64_t> SafetensorsReader::shape(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw UsageError("'" + path_ + "' has no tensor '" + name + "'");
  return it->second.shape;
}

at::ScalarType SafetensorsReader::dtype(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw UsageError("'" + path_ + "' has no tensor '" + name + "'");
  return it->second.dtype;
}

at::Tensor SafetensorsReader::read(const std::string& name) {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw UsageError("'" + path_ + "' has no tensor '" + name + "'");
  const Entry& e = it->second;
  at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(e.dtype));
  in_.clear();
  in_.seekg(data_start_ + e.offset);
  in_.read(static_cast<char*>(t.data_ptr()), static_cast<std::streamsize>(e.bytes));
  if (!in_) throw UsageError("'" + path_ + "': could not read tensor '" + name + "' (truncated?)");
  return t;
}

SafetensorsFile read_safetensors(const std::string& path) {
  SafetensorsReader reader(path);
  SafetensorsFile result;
  result.metadata = reader.metadata();
  for (const auto& name : reader.names()) result.tensors[name] = reader.read(name);
  return result;
}

}  // namespace crosstrain::checkpoint
