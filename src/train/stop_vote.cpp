#include "crosstrain/train/stop_vote.h"

namespace crosstrain::train {

StopVote::StopVote(comm::Communicator& world, std::function<bool()> requested, int64_t every)
    : world_(world), requested_(every > 0 ? std::move(requested) : nullptr), every_(every),
      flag_(at::zeros({1}, at::kInt)) {}

bool StopVote::agreed() {
  if (!exchange_) return false;
  exchange_->wait();
  exchange_.reset();
  return flag_.item<int>() != 0;
}

void StopVote::post(int64_t step) {
  if (!requested_ || step % every_ != 0) return;
  finish();  // one vote in flight at a time: the buffer is shared
  flag_.fill_(requested_() ? 1 : 0);
  exchange_ = world_.all_reduce(flag_, comm::ReduceOp::Max);
}

void StopVote::finish() {
  if (exchange_) exchange_->wait();
  exchange_.reset();
}

}  // namespace crosstrain::train
