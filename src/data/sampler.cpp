#include "crosstrain/data/sampler.h"

#include <random>
#include <string>

#include "crosstrain/core/error.h"

namespace crosstrain::data {

DistributedSampler::DistributedSampler(uint64_t seed, int64_t stream_size, int64_t block_size, int64_t global_batch,
                                       int dp_rank, int dp_size, int micro_batches)
    : seed_(seed), positions_(stream_size - block_size), global_batch_(global_batch), dp_rank_(dp_rank),
      dp_size_(dp_size), micro_batches_(micro_batches) {
  if (dp_size < 1 || dp_rank < 0 || dp_rank >= dp_size)
    throw UsageError("sampler: data-parallel rank " + std::to_string(dp_rank) + " of " + std::to_string(dp_size));
  if (micro_batches < 1) throw UsageError("train.micro_batches must be at least 1");
  if (global_batch < 1 || global_batch % (static_cast<int64_t>(dp_size) * micro_batches) != 0)
    throw UsageError("train.global_batch = " + std::to_string(global_batch) + " is not divisible by " +
                     std::to_string(dp_size) + " data-parallel ranks x " + std::to_string(micro_batches) +
                     " micro-batches; pick a multiple of " + std::to_string(dp_size * micro_batches));
  if (positions_ < 1)
    throw UsageError("the data has " + std::to_string(stream_size) + " tokens, fewer than one sequence of " +
                     std::to_string(block_size + 1));
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
  const int64_t per_rank = global_batch_ / dp_size_;
  const int64_t per_micro = per_rank / micro_batches_;
  auto begin = all.begin() + dp_rank_ * per_rank + micro * per_micro;
  return std::vector<int64_t>(begin, begin + per_micro);
}

void DistributedSampler::restore(const SamplerState& state) {
  if (state.seed != seed_)
    throw UsageError("the checkpoint's data order was seeded with " + std::to_string(state.seed) +
                     " but this run uses " + std::to_string(seed_) + "; resume with the same run.seed");
  next_step_ = state.next_step;
}

}  // namespace crosstrain::data
