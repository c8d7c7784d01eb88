// In-process back end: ranks are threads sharing one hub. The reference the other back ends are tested
// against, and a fast way to test multi-rank logic without processes.
//
// Collectives post a copy of their input at once and compute their result in wait(), when every member has
// posted; results follow reduce_reference() exactly. Sends are buffered. A member that never posts makes
// the others fail after the timeout, with the missing ranks named. Calls that disagree (rank 0 all-reduces
// while rank 1 broadcasts) fail with both operations named.
#pragma once

#include <functional>
#include <memory>

#include "crosstrain/comm/communicator.h"

namespace crosstrain::comm {

namespace detail {
struct FakeHub;
}

class FakeWorld {
 public:
  explicit FakeWorld(int size, Millis timeout = Millis(30000));
  int size() const { return size_; }
  // The world communicator of `rank`; call once per rank.
  std::unique_ptr<Communicator> communicator(int rank);

  // Runs body(comm) on one thread per rank and rethrows the first exception (lowest rank first).
  static void run(int size, const std::function<void(Communicator&)>& body, Millis timeout = Millis(30000));

 private:
  int size_;
  Millis timeout_;
  std::shared_ptr<detail::FakeHub> hub_;
};

}  // namespace crosstrain::comm
