// A c10d::Store whose waits end as soon as the caller gives up on what it waits for. An elastic generation's group
// forms over the store (Gloo's rendezvous waits for each member's address); when a failure ends that generation
// first, the members it waits for have gone to the next one and will never set their keys. Through this wrapper
// the wait ends within a slice (100 ms) of being abandoned instead of after the whole timeout, which held every
// survivor for 10 s on a loaded machine. Every other request passes straight through.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <string>

namespace crosstrain::comm::store {

class AbandonableStore : public c10d::Store {
 public:
  // `abandoned` is polled between slices of a wait, on whichever thread waits (Gloo may form a group on a helper
  // thread that outlives the caller's wait): it must be thread-safe and own what it reads. `why` ends the CommError
  // thrown when it says true.
  AbandonableStore(c10::intrusive_ptr<c10d::Store> inner, std::function<bool()> abandoned, std::string why);

  void set(const std::string& key, const std::vector<uint8_t>& value) override { inner_->set(key, value); }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    return inner_->compareSet(key, expected, desired);
  }
  // Waits (in slices) for the key, then reads it.
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override { return inner_->add(key, value); }
  bool deleteKey(const std::string& key) override { return inner_->deleteKey(key); }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(keys); }
  int64_t getNumKeys() override { return inner_->getNumKeys(); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, inner_->getTimeout()); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  static constexpr std::chrono::milliseconds kSlice{100};

 private:
  c10::intrusive_ptr<c10d::Store> inner_;
  std::function<bool()> abandoned_;
  std::string why_;
};

}  // namespace crosstrain::comm::store
