// Which sequences each data-parallel rank trains on at each step. Pure: no communication, no I/O.
//
// Step s draws the global batch of `global_batch` sequence offsets from a generator seeded by (seed, s), so
// every rank computes the same global batch, takes its own disjoint slice, and a restored run continues with
// exactly the batches an uninterrupted one would have seen. The position to save is the next step. Slices are
// equal by default; clusters of different speed may give their ranks uneven ones (sync.cluster_batch), still
// consecutive and in rank order, so they stay disjoint and cover the global batch.
#pragma once

#include <cstdint>
#include <vector>

namespace crosstrain::data {

struct SamplerState {
  uint64_t seed = 0;
  int64_t next_step = 0;
};

class DistributedSampler {
 public:
  // stream_size: tokens in the split; each sequence needs block_size + 1 of them. rank_batches: the sequences per
  // step of each data-parallel rank (adding up to global_batch, each divisible by micro_batches); empty: equal.
  DistributedSampler(uint64_t seed, int64_t stream_size, int64_t block_size, int64_t global_batch, int dp_rank,
                     int dp_size, int micro_batches = 1, const std::vector<int64_t>& rank_batches = {});

  // The whole global batch of step `step` (same on every rank).
  std::vector<int64_t> global_offsets(int64_t step) const;
  // This rank's part of micro-batch `micro` of step `step`.
  std::vector<int64_t> local_offsets(int64_t step, int micro) const;
  int64_t local_batch() const { return local_batch_; }
  int64_t local_micro_batch() const { return local_batch_ / micro_batches_; }

  SamplerState state() const { return {seed_, next_step_}; }
  void restore(const SamplerState& state);
  // Advances the saved position past `step`.
  void mark_done(int64_t step) { next_step_ = step + 1; }

 private:
  void take_uneven_slice(const std::vector<int64_t>& rank_batches);

  uint64_t seed_;
  int64_t positions_;
  int64_t global_batch_;
  int dp_rank_, dp_size_, micro_batches_;
  int64_t first_ = 0, local_batch_ = 0;  // this rank's slice of the global batch
  int64_t next_step_ = 0;
};

}  // namespace crosstrain::data
