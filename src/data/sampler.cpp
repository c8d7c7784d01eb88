#include "crosstrain/data/sampler.h"

#include <random>
#include <string>

#include "crosstrain/core/error.h"

namespace crosstrain::data {

DistributedSampler::DistributedSampler(uint64_t seed, int64_t stream_size, int64_t block_size, int64_t global_batch,
                                       int dp_rank, int dp_size, int micro_batches,
                                       const std::vector<int64_t>& rank_batches)
    : seed_(seed), positions_(stream_size - block_size), global_batch_(global_batch), dp_rank_(dp_rank),
      dp_size_(dp_size), micro_batches_(micro_batches) {
  if (dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size)
    throw UsageError("sampler: data-parallel rank " + std::to_string(dp_rank) + " of " + std::to_string(dp_size));
  if (micro_batches < 1) throw UsageError("train.micro_batches must be at least 1");
  const bool even = rank_batches.empty();
  if (even && (global_batch < 1 || global_batch % (static_cast<int64_t>(dp_size) * micro_batches) != 0))
    throw UsageError("train.global_batch = " + std::to_string(global_batch) + " is not divisible by " +
                     std::to_string(dp_size) + " data-parallel ranks x " + std::to_string(micro_batches) +
                     " micro-batches; pick a multiple of " + std::to_string(dp_size * micro_batches));
  if (even) {
    local_batch_ = global_batch / dp_size;
    first_ = dp_rank * local_batch_;
  } else {
    take_uneven_slice(rank_batches);
  }
  if (positions_ < 1)
    throw UsageError("the data has " + std::to_string(stream_size) + " tokens, fewer than one sequence of " +
                     std::to_string(block_size + 1));
}

void DistributedSampler::take_uneven_slice(const std::vector<int64_t>& rank_batches) {
  int64_t sum = 0;
  for (int64_t n : rank_batches) {
    if (n < micro_batches_ || n % micro_batches_ != 0)
      throw UsageError("sampler: a rank's batch of " + std::to_string(n) + " sequences is not a positive multiple of " +
                       std::to_string(micro_batches_) + " micro-batches");
    sum += n;
  }
  if (static_cast<int>(rank_batches.size()) != dp_size_ || sum != global_batch_)
    throw UsageError("sampler: " + std::to_string(rank_batches.size()) + " rank batches adding up to " +
                     std::to_string(sum) + " for " + std::to_string(dp_size_) + " ranks and a global batch of " +
                     std::to_string(global_batch_));
  for (int r = 0; r < dp_rank_; ++r) first_ += rank_batches[r];
  local_batch_ = rank_batches[dp_rank_];
}

std::vector<int64_t> DistributedSampler::global_offsets(int64_t step) const {
  // seed_seq mixes (seed, step) so that neighbouring steps get unrelated draws.
  std::seed_seq seq{static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32), static_cast<uint32_t>(step),
                    static_cast<uint32_t>(static_cast<uint64_t>(step) >> 32)};
  std::mt19937_64 gen(seq);
  std::vector<int64_t> offsets(static_cast<size_t>(global_batch_));
  for (auto& o : offsets) o = static_cast<int64_t>(gen() % static_cast<uint64_t>(positions_));
  return offsets;
}

std::vector<int64_t> DistributedSampler::local_offsets(int64_t step, int micro) const {
  auto all = global_offsets(step);
  const int64_t per_micro = local_micro_batch();
  auto begin = all.begin() + first_ + micro * per_micro;
  return std::vector<int64_t>(begin, begin + per_micro);
}

void DistributedSampler::restore(const SamplerState& state) {
  if (state.seed != seed_)
    throw UsageError("the checkpoint's data order was seeded with " + std::to_string(state.seed) +
                     " but this run uses " + std::to_string(seed_) + "; resume with the same run.seed");
  next_step_ = state.next_step;
}

}  // namespace crosstrain::data
