#include "crosstrain/store/local_store.h"

#include <stdexcept>

#include "common.h"

namespace crosstrain::comm::store {

LocalStore::LocalStore(std::shared_ptr<StoreTable> table, std::string address, int rank,
                       std::chrono::milliseconds timeout)
    : c10d::Store(timeout), table_(std::move(table)), address_(std::move(address)), rank_(rank) {}

void LocalStore::fail(const std::string& what, const std::string& cause, bool timed_out) const {
  fail_store_op(rank_, timeout_, what, address_ + " (hosted here)", cause, timed_out);
}

void LocalStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  if (value.size() > kMaxValueBytes || key.size() > kMaxKeyBytes)
    fail("set of key '" + key.substr(0, 200) + "'", "the key or value is over the store's size limits");
  try {
    table_->set(key, text(value));
  } catch (const std::length_error& e) {
    fail("set of key '" + key + "'", e.what());
  }
}

std::vector<uint8_t> LocalStore::compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                            const std::vector<uint8_t>& desired) {
  try {
    return bytes(table_->compare_set(key, text(expected), text(desired)));
  } catch (const std::length_error& e) {
    fail("compareSet of key '" + key + "'", e.what());
  }
}

std::vector<uint8_t> LocalStore::get(const std::string& key) {
  auto value = table_->wait_get(key, StoreTable::Clock::now() + timeout_);
  if (!value) fail("get of key '" + key + "'", "the key was not set in time (has every rank started?)", true);
  return bytes(*value);
}

int64_t LocalStore::add(const std::string& key, int64_t value) {
  try {
    return table_->add(key, value);
  } catch (const std::exception& e) {
    fail("add to key '" + key + "'", e.what());
  }
}

bool LocalStore::deleteKey(const std::string& key) { return table_->erase(key); }

bool LocalStore::check(const std::vector<std::string>& keys) { return table_->contains_all(keys); }

int64_t LocalStore::getNumKeys() { return table_->size(); }

void LocalStore::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void LocalStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  const auto t = timeout == kNoTimeout ? timeout_ : timeout;  // nothing waits forever
  if (!table_->wait(keys, StoreTable::Clock::now() + t))
    fail("wait for " + describe_keys(keys), "not set within " + std::to_string(t.count()) + " ms (has every rank started?)",
         true);
}

std::vector<std::vector<uint8_t>> LocalStore::get_many(const std::vector<std::string>& keys, std::chrono::milliseconds wait) {
  const auto t = wait == kNoTimeout ? timeout_ : wait;
  const auto values = table_->wait_get_all(keys, StoreTable::Clock::now() + t);
  if (!values)
    fail("get of " + describe_keys(keys), "not all set within " + std::to_string(t.count()) + " ms (has every rank started?)",
         true);
  std::vector<std::vector<uint8_t>> out;
  out.reserve(values->size());
  for (const std::string& v : *values) out.push_back(bytes(v));
  return out;
}

}  // namespace crosstrain::comm::store
