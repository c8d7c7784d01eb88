#include "crosstrain/train/stop_vote.h"

#include <algorithm>

namespace crosstrain::train {

StopVote::StopVote(comm::Communicator& world, std::function<bool()> requested, StopCheck check)
    : world_(world), requested_(std::move(requested)), check_(check), flag_(at::zeros({1}, at::kInt)) {
  check_.every = std::max<int64_t>(1, check_.every);
  // One vote in flight at a time: the buffer is shared, so each is read before the next is posted.
  check_.lag = std::clamp<int64_t>(check_.lag, 1, check_.every);
}

bool StopVote::agreed(int64_t step) {
  if (!exchange_ || step < posted_at_ + check_.lag) return false;
  exchange_->wait();
  exchange_.reset();
  return flag_.item<int>() != 0;
}

void StopVote::post(int64_t step) {
  if (!requested_ || step % check_.every != 0) return;
  finish();
  flag_.fill_(requested_() ? 1 : 0);
  exchange_ = world_.all_reduce(flag_, comm::ReduceOp::Max);
  posted_at_ = step;
}

void StopVote::finish() {
  if (exchange_) exchange_->wait();
  exchange_.reset();
}

}  // namespace crosstrain::train
