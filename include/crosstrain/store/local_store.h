// A c10d::Store over the hosting process's own table: rank 0, when it hosts the rendezvous store itself (under
// mpirun/srun), uses it without a socket. Same semantics and timeouts as StoreClient.
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>
#include <string>

#include "crosstrain/store/reads_many_keys.h"
#include "crosstrain/store/table.h"

namespace crosstrain::comm::store {

class LocalStore : public c10d::Store, public ReadsManyKeys {
 public:
  // `address` and `rank` only go into error messages.
  LocalStore(std::shared_ptr<StoreTable> table, std::string address, int rank, std::chrono::milliseconds timeout);

  void set(const std::string& key, const std::vector<uint8_t>& value) override;
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>& expected,
                                  const std::vector<uint8_t>& desired) override;
  std::vector<uint8_t> get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t value) override;
  bool deleteKey(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;
  int64_t getNumKeys() override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  std::vector<std::vector<uint8_t>> get_many(const std::vector<std::string>& keys, std::chrono::milliseconds wait) override;

 private:
  [[noreturn]] void fail(const std::string& what, const std::string& cause, bool timed_out = false) const;

  std::shared_ptr<StoreTable> table_;
  std::string address_;
  int rank_;
};

}  // namespace crosstrain::comm::store
