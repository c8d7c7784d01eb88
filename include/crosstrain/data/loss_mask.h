// Which next-token targets of a packed token stream are trained (supervised fine-tuning on prompt/response pairs).
//
// One byte per token of the stream: kTrained when the target that predicts this token counts in the loss (a
// response token or the end-of-text token after it), kExampleStart on each example's first token. A window of
// the stream (a training sequence starting at any offset) trains a target only when the token it predicts is
// kTrained and that token's example starts inside the window: an example cut by the window's start has lost
// its prompt, so its remaining tokens are not trained. The first token of an example is never kTrained, so
// the target crossing from one example's end into the next is never trained either.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace crosstrain::data {

// torch's cross-entropy convention: a target of -100 is ignored, and the mean runs over the others.
constexpr int64_t kIgnoreTarget = -100;

class LossMask {
 public:
  static constexpr uint8_t kTrained = 1;
  static constexpr uint8_t kExampleStart = 2;

  LossMask() = default;  // empty: every target is trained (plain language-model data)
  explicit LossMask(std::shared_ptr<const std::vector<uint8_t>> flags)
      : owner_(std::move(flags)), data_(owner_->data()), size_(owner_->size()) {}
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  uint8_t operator[](size_t i) const { return data_[i]; }
  LossMask slice(size_t begin, size_t end) const;

  // Sets the untrained targets of the sequences at `offsets` (targets [offsets.size(), block_size], row-major,
  // as make_batch fills them) to kIgnoreTarget; returns how many targets remain trained.
  int64_t apply(const std::vector<int64_t>& offsets, int64_t block_size, int64_t* targets) const;
  // How many targets of the sequences at `offsets` are trained (what apply would return).
  int64_t count(const std::vector<int64_t>& offsets, int64_t block_size) const;

 private:
  std::shared_ptr<const std::vector<uint8_t>> owner_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// The weight of each micro-batch's masked-mean loss so that every layout trains on the same objective: the sum
// of the cross-entropies of every trained target of the step's global batch over their number. `counts`: the
// trained targets of each local micro-batch; `micro_sequences`: sequences per local micro-batch;
// `global_count` and `global_sequences`: the same over the whole global batch. Unmasked data gives weights of 1.
std::vector<double> micro_batch_loss_weights(const std::vector<int64_t>& counts, int64_t micro_sequences,
                                             int64_t global_count, int64_t global_sequences);

}  // namespace crosstrain::data
