// Four in-process ranks all-reduce through the installed library.
#include <ATen/ATen.h>

#include <cstdio>

#include "crosstrain/comm/backends/fake.h"

int main() {
  float result = 0;
  crosstrain::comm::FakeWorld::run(4, [&](crosstrain::comm::Communicator& c) {
    at::Tensor t = at::full({2}, static_cast<float>(c.rank()));
    c.all_reduce(t, crosstrain::comm::ReduceOp::Sum)->wait();
    if (c.rank() == 0) result = t[0].item<float>();
  });
  std::printf("consumer: sum of ranks = %g\n", result);
  return result == 6.0f ? 0 : 1;
}
