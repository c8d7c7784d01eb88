#include "crosstrain/train/stop_vote.h"

#include <algorithm>

namespace crosstrain::train {

StopVote::StopVote(comm::Communicator& world, std::function<bool()> requested, StopCheck check)
    : world_(world), requested_(check.every > 0 ? std::move(requested) : nullptr), check_(check),
      flag_(at::zeros({1}, at::kInt)) {
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

HeardStop::HeardStop(comm::Communicator& world, std::function<bool()> requested, Job& job,
                     std::function<bool(int64_t)> meets)
    : world_(world), requested_(job.stop_check().every == 0 ? std::move(requested) : nullptr), job_(job),
      meets_(std::move(meets)) {}

bool HeardStop::stops_before(int64_t step) {
  if (!requested_) return false;
  if (stop_after_ < 0) {
    if (!asked_ && requested_()) {
      job_.ask_to_stop();
      asked_ = true;
    }
    const bool heard = job_.stop_heard();
    if (!heard && !meets_(step)) return false;
    // [heard, last step done]: each rank sends it on hearing, or before a step where the ranks meet.
    at::Tensor mine = at::tensor({heard ? int64_t{1} : int64_t{0}, step - 1}, at::kLong);
    world_.all_reduce(mine, comm::ReduceOp::Max)->wait();
    if (mine[0].item<int64_t>() != 0) stop_after_ = mine[1].item<int64_t>();
  }
  return stop_after_ >= 0 && step > stop_after_;
}

}  // namespace crosstrain::train
