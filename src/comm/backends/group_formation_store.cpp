#include "crosstrain/comm/backends/group_formation_store.h"

#include <cstdlib>

#include "crosstrain/core/error.h"
#include "crosstrain/store/abandonable_store.h"

namespace crosstrain::comm {
namespace {
using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;
}  // namespace

GroupFormationStore::GroupFormationStore(c10::intrusive_ptr<c10d::Store> base, std::string prefix, int rank, int size,
                                         std::function<bool()> abandoned, const std::string& group)
    : c10d::Store(base->getTimeout()), many_(dynamic_cast<store::ReadsManyKeys*>(base.get())),
      prefix_(std::move(prefix)), rank_(rank), size_(size), abandoned_(std::move(abandoned)),
      why_("group '" + group + "' was given up before it formed") {
  if (abandoned_) inner_ = c10::make_intrusive<store::AbandonableStore>(base, abandoned_, why_);
  else inner_ = base;
}

std::vector<std::string> GroupFormationStore::prefixed(const std::vector<std::string>& keys) const {
  std::vector<std::string> out;
  out.reserve(keys.size());
  for (const std::string& k : keys) out.push_back(prefix_ + k);
  return out;
}

std::optional<GroupFormationStore::MemberKey> GroupFormationStore::member_key(const std::string& key) const {
  const size_t slash = key.find('/');
  if (!many_ || slash == std::string::npos || slash == 0 || key.size() - slash > 16) return std::nullopt;
  const std::string device = key.substr(0, slash);
  std::string member = key.substr(slash + 1);
  const bool host = member.rfind("rank_", 0) == 0;
  if (host) member = member.substr(5);
  if (member.empty()) return std::nullopt;
  for (char ch : device + member)
    if (ch < '0' || ch > '9') return std::nullopt;
  const long m = std::strtol(member.c_str(), nullptr, 10);
  // Gloo reads every other member's address, and the host names of the members below this rank only.
  if (m < 0 || m >= size_ || m == rank_ || (host && m > rank_) || member != std::to_string(m)) return std::nullopt;
  return MemberKey{device + (host ? "/rank_" : "/"), static_cast<int>(m), host ? rank_ : size_};
}

const std::vector<std::vector<uint8_t>>& GroupFormationStore::members(const MemberKey& k, Millis timeout) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = read_.find(k.stem);
  if (it != read_.end()) return it->second;
  std::vector<std::string> keys;
  for (int m = 0; m < k.below; ++m)
    if (m != rank_) keys.push_back(prefix_ + k.stem + std::to_string(m));
  // c10d's kNoTimeout (0) means the store's own timeout.
  const auto deadline = Clock::now() + (timeout.count() > 0 ? timeout : timeout_);
  std::vector<std::vector<uint8_t>> values;
  for (;;) {
    if (abandoned_ && abandoned_()) {
      CommContext c;
      c.op = "store wait";
      throw CommError(c, "gave up waiting for '" + keys.front() + "': " + why_);
    }
    const auto left = std::chrono::duration_cast<Millis>(deadline - Clock::now());
    // Without a caller that may give up, one wait to the deadline; else slices, the last of them the store's own.
    const Millis cap = abandoned_ ? store::AbandonableStore::kSlice : left;
    const Millis slice = std::max(Millis(1), std::min(left, cap));
    try {
      values = many_->get_many(keys, slice);
      break;
    } catch (const CommError& e) {
      if (!e.timed_out() || slice >= left) throw;
    }
  }
  ++batched_reads_;
  std::vector<std::vector<uint8_t>> by_member(size_);
  for (int m = 0, i = 0; m < k.below; ++m)
    if (m != rank_) by_member[m] = std::move(values[i++]);
  return read_.emplace(k.stem, std::move(by_member)).first->second;
}

std::vector<uint8_t> GroupFormationStore::get(const std::string& key) {
  if (auto member = member_key(key)) return members(*member, timeout_)[member->member];
  return inner_->get(prefix_ + key);
}

void GroupFormationStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  bool all_members = !keys.empty();
  for (const std::string& key : keys) all_members = all_members && member_key(key).has_value();
  if (!all_members) return inner_->wait(prefixed(keys), timeout);
  for (const std::string& key : keys) (void)members(*member_key(key), timeout);
}

}  // namespace crosstrain::comm
