// The base every algorithm object is built on: Scratch (one byte arena carved into 64-byte-aligned pieces at each
// call, grown only when a call needs more) and CollectiveAlgorithm's constructor (tag, timeout and option checks)
// and reserve. The pairwise all-to-all every algorithm inherits is in all_to_all.cpp.
#include "crosstrain/comm/algorithms/collective_algorithm.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "crosstrain/core/error.h"

namespace crosstrain::comm::algo {
namespace {

constexpr int64_t kAlign = 64;

int64_t round_up(int64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

}  // namespace

// --- scratch ---------------------------------------------------------------------------------------------------

void Scratch::reserve(int64_t bytes) {
  if (bytes <= capacity()) return;
  arena_ = at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
  ++allocations_;
}

int64_t Scratch::capacity() const { return arena_.defined() ? arena_.numel() : 0; }

int64_t Scratch::bytes_for(std::initializer_list<int64_t> piece_bytes) {
  int64_t total = 0;
  for (int64_t b : piece_bytes) total += round_up(b);
  return total;
}

at::Tensor Scratch::take(int64_t numel, at::ScalarType dtype) {
  auto options = at::TensorOptions().dtype(dtype);
  if (numel == 0) return at::empty({0}, options);
  const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
  const int64_t begin = round_up(used_);
  // Pieces taken before keep the old arena alive; the new one is sized for the whole layout so the next call
  // with the same sizes fits.
  if (begin + bytes > capacity()) {
    arena_ = at::empty({begin + bytes}, at::TensorOptions().dtype(at::kByte));
    ++allocations_;
  }
  used_ = begin + bytes;
  at::Tensor arena = arena_;
  return at::from_blob(static_cast<uint8_t*>(arena_.data_ptr()) + begin, {numel}, [arena](void*) {}, options);
}

// --- the base object -------------------------------------------------------------------------------------------

CollectiveAlgorithm::CollectiveAlgorithm(Algorithm kind, Communicator& comm, const AlgorithmOptions& options)
    : comm_(comm),
      options_(options),
      kind_(kind),
      tag_(options.tag),
      timeout_(options.timeout.count() > 0 ? options.timeout : comm.timeout()) {
  if (options.tag < 0) throw UsageError(std::string(to_string(kind)) + ": tags must be non-negative");
  if (options.segments < 1) throw UsageError(std::string(to_string(kind)) + ": segments must be at least 1");
}

void CollectiveAlgorithm::reserve(int64_t numel, at::ScalarType dtype) {
  scratch_.reserve(scratch_need(numel, static_cast<int64_t>(c10::elementSize(dtype))));
}

}  // namespace crosstrain::comm::algo
