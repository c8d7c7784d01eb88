// The key-value table behind the rendezvous store, with c10d's semantics (add on decimal text, compareSet,
// blocking waits). Thread-safe; no sockets, so the server and the in-process store share it and tests use it
// directly.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "crosstrain/store/protocol.h"

namespace crosstrain::comm::store {

class StoreTable {
 public:
  using Clock = std::chrono::steady_clock;

  explicit StoreTable(size_t max_bytes = kMaxStoreBytes) : max_bytes_(max_bytes) {}

  // Throws std::length_error when the table would hold more than max_bytes (keys and values together).
  void set(const std::string& key, std::string value);
  std::optional<std::string> get(const std::string& key) const;
  // Adds to the decimal integer stored at key (absent: 0) and returns the sum; throws ProtocolError when the
  // value there is not an integer, std::overflow_error when the sum does not fit in 64 bits.
  int64_t add(const std::string& key, int64_t delta);
  // c10d's compareSet: stores `desired` when the current value equals `expected` (absent counts as equal to an
  // empty `expected`) and returns it; otherwise returns the current value (or `expected` when absent).
  std::string compare_set(const std::string& key, const std::string& expected, std::string desired);
  bool erase(const std::string& key);
  bool contains_all(const std::vector<std::string>& keys) const;
  int64_t size() const;

  // Blocks until every key exists (true), or the deadline passes or close() is called (false).
  bool wait(const std::vector<std::string>& keys, Clock::time_point deadline);
  // Like get, but waits for the key first; nullopt when it did not appear in time.
  std::optional<std::string> wait_get(const std::string& key, Clock::time_point deadline);
  // Waits until every key exists, then returns their values in order (read together); nullopt when some key did
  // not appear in time.
  std::optional<std::vector<std::string>> wait_get_all(const std::vector<std::string>& keys, Clock::time_point deadline);
  // Wakes every waiter for good: the server is shutting down.
  void close();

 private:
  bool all_present(const std::vector<std::string>& keys) const;  // with mu_ held
  void store(const std::string& key, std::string value);          // with mu_ held

  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::string> data_;
  size_t bytes_ = 0;
  size_t max_bytes_;
  bool closed_ = false;
};

}  // namespace crosstrain::comm::store
