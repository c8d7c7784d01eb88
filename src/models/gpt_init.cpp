#include "crosstrain/models/gpt_init.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <vector>

#include "crosstrain/core/error.h"

namespace crosstrain::models {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t parameter_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a: std::hash is not stable across standard libraries
  for (unsigned char ch : name) {
    h ^= ch;
    h *= 0x100000001b3ULL;
  }
  // ATen's mt19937 keeps only the low 32 bits of its seed: mix so that they depend on every bit of both.
  return splitmix64(seed ^ splitmix64(h));
}

void fill_initial(at::Tensor& out, const ParameterPlan& p, uint64_t seed) {
  if (out.sizes().vec() != p.shape)
    throw Error("initialising '" + p.name + "': the tensor is " + c10::str(out.sizes()) + " but the plan says " +
                c10::str(c10::IntArrayRef(p.shape)));
  switch (p.init) {
    case Init::Normal: {
      at::Generator gen = at::detail::createCPUGenerator(parameter_seed(seed, p.name));
      out.normal_(0.0, p.init_std, gen);
      break;
    }
    case Init::Ones: out.fill_(1.0); break;
    case Init::Zeros: out.zero_(); break;
  }
}

at::Tensor shard_of(const ParameterPlan& p, const at::Tensor& full, int tp_rank, int tp_size) {
  const ShardSlice s = shard_slice(p, tp_rank, tp_size);
  if (s.dim < 0) return full;
  std::vector<at::Tensor> pieces;
  for (const auto& range : s.ranges) pieces.push_back(full.narrow(s.dim, range.start, range.length));
  return pieces.size() == 1 ? pieces[0] : at::cat(pieces, s.dim);
}

at::Tensor initial_shard(const ParameterPlan& p, uint64_t seed, int tp_rank, int tp_size) {
  at::Tensor full = at::empty(p.shape, at::kFloat);
  fill_initial(full, p, seed);
  return shard_of(p, full, tp_rank, tp_size);
}

}  // namespace crosstrain::models
