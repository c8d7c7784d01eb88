#include "crosstrain/store/table.h"

#include <stdexcept>

namespace crosstrain::comm::store {

void StoreTable::store(const std::string& key, std::string value) {
  auto it = data_.find(key);
  const size_t old = it == data_.end() ? 0 : key.size() + it->second.size();
  const size_t now = key.size() + value.size();
  // A member of the job could still fill the launcher's memory with many large values: bound the total.
  if (bytes_ - old + now > max_bytes_)
    throw std::length_error("the store is full: " + std::to_string(bytes_ - old + now) + " bytes would exceed its " +
                            std::to_string(max_bytes_) + "-byte limit");
  bytes_ = bytes_ - old + now;
  data_[key] = std::move(value);
  changed_.notify_all();
}

void StoreTable::set(const std::string& key, std::string value) {
  std::lock_guard<std::mutex> lock(mu_);
  store(key, std::move(value));
}

std::optional<std::string> StoreTable::get(const std::string& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return std::nullopt;
  return it->second;
}

int64_t StoreTable::add(const std::string& key, int64_t delta) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = data_.find(key);
  const int64_t now = it == data_.end() ? 0 : parse_int(it->second);
  int64_t sum = 0;
  // Signed overflow is undefined behaviour, and a peer chooses the delta: refuse rather than wrap.
  if (__builtin_add_overflow(now, delta, &sum))
    throw std::overflow_error("adding " + std::to_string(delta) + " to key '" + key.substr(0, 200) + "' (now " +
                              std::to_string(now) + ") would overflow a 64-bit integer; the key is unchanged");
  store(key, std::to_string(sum));
  return sum;
}

std::string StoreTable::compare_set(const std::string& key, const std::string& expected, std::string desired) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = data_.find(key);
  if (it == data_.end()) {
    if (!expected.empty()) return expected;
  } else if (it->second != expected) {
    return it->second;
  }
  store(key, desired);
  return desired;
}

bool StoreTable::erase(const std::string& key) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = data_.find(key);
  if (it == data_.end()) return false;
  bytes_ -= key.size() + it->second.size();
  data_.erase(it);
  changed_.notify_all();
  return true;
}

bool StoreTable::all_present(const std::vector<std::string>& keys) const {
  for (const auto& k : keys)
    if (!data_.count(k)) return false;
  return true;
}

bool StoreTable::contains_all(const std::vector<std::string>& keys) const {
  std::lock_guard<std::mutex> lock(mu_);
  return all_present(keys);
}

int64_t StoreTable::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(data_.size());
}

bool StoreTable::wait(const std::vector<std::string>& keys, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_until(lock, deadline, [&] { return closed_ || all_present(keys); });
  return !closed_ && all_present(keys);
}

std::optional<std::string> StoreTable::wait_get(const std::string& key, Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_until(lock, deadline, [&] { return closed_ || data_.count(key) > 0; });
  auto it = data_.find(key);
  if (closed_ || it == data_.end()) return std::nullopt;
  return it->second;
}

std::optional<std::vector<std::string>> StoreTable::wait_get_all(const std::vector<std::string>& keys,
                                                                 Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_until(lock, deadline, [&] { return closed_ || all_present(keys); });
  if (closed_ || !all_present(keys)) return std::nullopt;
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const std::string& key : keys) values.push_back(data_.at(key));
  return values;
}

void StoreTable::close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  changed_.notify_all();
}

}  // namespace crosstrain::comm::store
