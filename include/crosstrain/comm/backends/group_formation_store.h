// The store a Gloo group forms over (comm/backends/gloo.cpp). Its keys live under the group's prefix, and the
// members' addresses are read together.
//
// Gloo's full-mesh rendezvous sets this rank's host name under "<device>/rank_<rank>" and reads those of the
// members below it (to number the ranks of a host), then sets its addresses under "<device>/<rank>" and waits for
// and reads every other member's in turn. Through the elastic wrapper that is up to four round trips per member:
// a six-rank group took 1.5 s to form across a 25 ms link, and a generation forms several groups. Here the first
// wait for or read of one of those keys reads all of its kind at once (one GetMany, in slices of 100 ms so that a
// group given up on stops within a slice), and the others come from that read: two round trips in all. Any other
// key, or a base store that cannot read many keys, goes through as before.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "crosstrain/store/reads_many_keys.h"

namespace crosstrain::comm {

class GroupFormationStore : public c10d::Store {
 public:
  // `base`: the job's store; `prefix`: the group's ("elastic/g3/"); `rank` and `size`: in the group. With
  // `abandoned` set, every wait ends within a slice once it says true (store/abandonable_store.h), naming `group`.
  GroupFormationStore(c10::intrusive_ptr<c10d::Store> base, std::string prefix, int rank, int size,
                      std::function<bool()> abandoned, const std::string& group);

  void set(const std::string& key, const std::vector<uint8_t>& value) override { inner_->set(prefix_ + key, value); }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override {
    return inner_->compareSet(prefix_ + key, expected, desired);
  }
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override { return inner_->add(prefix_ + key, value); }
  bool deleteKey(const std::string& key) override { return inner_->deleteKey(prefix_ + key); }
  bool check(const std::vector<std::string>& keys) override { return inner_->check(prefixed(keys)); }
  int64_t getNumKeys() override { return inner_->getNumKeys(); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  // Round trips that read members' keys together (tests: two per device of the group).
  int batched_reads() const { return batched_reads_; }

 private:
  // A key Gloo reads of another member: "<device>/<member>" (its addresses) or "<device>/rank_<member>" (its
  // host name, read of the members below this rank).
  struct MemberKey {
    std::string stem;  // "<device>/" or "<device>/rank_"
    int member;
    int below;  // the keys of this kind are those of the members below this (except this rank)
  };
  std::optional<MemberKey> member_key(const std::string& key) const;
  // The values of every key of the kind of `k`, read together once (index: member; this rank's is empty).
  const std::vector<std::vector<uint8_t>>& members(const MemberKey& k, std::chrono::milliseconds timeout);
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const;

  c10::intrusive_ptr<c10d::Store> inner_;  // the base store, or an AbandonableStore over it
  store::ReadsManyKeys* many_;             // the base store, when it reads many keys at once
  std::string prefix_;
  int rank_, size_;
  std::function<bool()> abandoned_;
  std::string why_;
  std::mutex mu_;
  std::map<std::string, std::vector<std::vector<uint8_t>>> read_;  // by stem
  int batched_reads_ = 0;
};

}  // namespace crosstrain::comm
