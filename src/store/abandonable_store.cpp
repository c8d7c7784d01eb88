#include "crosstrain/store/abandonable_store.h"

#include <algorithm>

#include "crosstrain/core/error.h"

namespace crosstrain::comm::store {

AbandonableStore::AbandonableStore(c10::intrusive_ptr<c10d::Store> inner, std::function<bool()> abandoned,
                                   std::string why)
    : c10d::Store(inner->getTimeout()), inner_(std::move(inner)), abandoned_(std::move(abandoned)), why_(std::move(why)) {}

std::vector<uint8_t> AbandonableStore::get(const std::string& key) {
  wait({key}, inner_->getTimeout());
  return inner_->get(key);
}

void AbandonableStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  using Clock = std::chrono::steady_clock;
  // c10d's kNoTimeout (0) means the store's own timeout, as it does for the inner store.
  const auto deadline = Clock::now() + (timeout.count() > 0 ? timeout : inner_->getTimeout());
  for (;;) {
    if (abandoned_()) {
      CommContext c;
      c.op = "store wait";
      throw CommError(c, "gave up waiting for '" + (keys.empty() ? std::string() : keys.front()) + "': " + why_);
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    // The last slice is the inner store's own wait, so a real timeout reads as the inner store words it.
    const auto slice = std::max(std::chrono::milliseconds(1), std::min(left, kSlice));
    try {
      inner_->wait(keys, slice);
      return;
    } catch (const CommError& e) {
      if (!e.timed_out() || slice >= left) throw;
    }
  }
}

}  // namespace crosstrain::comm::store
