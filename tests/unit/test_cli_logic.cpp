#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include "../../src/apps/bench_comm.h"
#include "../../src/apps/launcher.h"
#include "crosstrain/comm/reference.h"
#include "crosstrain/core/error.h"

using namespace crosstrain;

TEST(Master, Parses) {
  std::string host;
  int port = 0;
  apps::parse_master("10.0.0.1:29500", host, port);
  EXPECT_EQ(host, "10.0.0.1");
  EXPECT_EQ(port, 29500);
  apps::parse_master("[::1]:80", host, port);
  EXPECT_EQ(host, "::1");
  EXPECT_EQ(port, 80);
  EXPECT_THROW(apps::parse_master("nohost", host, port), UsageError);
  EXPECT_THROW(apps::parse_master("h:99999", host, port), UsageError);
  EXPECT_THROW(apps::parse_master("h:12ab", host, port), UsageError);
}

TEST(BenchSizes, Parses) {
  int64_t lo = 0, hi = 0;
  apps::parse_sizes("4:256M", lo, hi);
  EXPECT_EQ(lo, 4);
  EXPECT_EQ(hi, 256LL << 20);
  apps::parse_sizes("64K", lo, hi);
  EXPECT_EQ(lo, 64 << 10);
  EXPECT_EQ(hi, 64 << 10);
  EXPECT_THROW(apps::parse_sizes("1M:4K", lo, hi), UsageError);
  EXPECT_THROW(apps::parse_sizes("lots", lo, hi), UsageError);
  EXPECT_THROW(apps::parse_sizes("4X", lo, hi), UsageError);
}

TEST(BenchBusBw, FactorsOfNcclTests) {
  EXPECT_DOUBLE_EQ(apps::busbw_factor("allreduce", 4), 1.5);
  EXPECT_DOUBLE_EQ(apps::busbw_factor("allgather", 4), 0.75);
  EXPECT_DOUBLE_EQ(apps::busbw_factor("reducescatter", 2), 0.5);
  EXPECT_DOUBLE_EQ(apps::busbw_factor("alltoall", 8), 7.0 / 8);
  EXPECT_DOUBLE_EQ(apps::busbw_factor("broadcast", 8), 1.0);
  EXPECT_DOUBLE_EQ(apps::busbw_factor("reduce", 8), 1.0);
}

TEST(ReduceReference, Semantics) {
  using comm::ReduceOp;
  std::vector<at::Tensor> ints{at::tensor({1, -7}, at::kInt), at::tensor({2, 2}, at::kInt)};
  EXPECT_TRUE(at::equal(comm::reduce_reference(ints, ReduceOp::Sum), at::tensor({3, -5}, at::kInt)));
  EXPECT_TRUE(at::equal(comm::reduce_reference(ints, ReduceOp::Avg), at::tensor({1, -2}, at::kInt)));  // trunc
  EXPECT_TRUE(at::equal(comm::reduce_reference(ints, ReduceOp::Min), at::tensor({1, -7}, at::kInt)));
  EXPECT_TRUE(at::equal(comm::reduce_reference(ints, ReduceOp::Product), at::tensor({2, -14}, at::kInt)));
  auto b = [](std::vector<int> v) { return at::tensor(v, at::kInt).to(at::kBool); };
  std::vector<at::Tensor> bools{b({1, 0, 0}), b({1, 1, 0})};
  EXPECT_TRUE(at::equal(comm::reduce_reference(bools, ReduceOp::Sum), b({1, 1, 0})));
  EXPECT_TRUE(at::equal(comm::reduce_reference(bools, ReduceOp::Product), b({1, 0, 0})));
  EXPECT_THROW(comm::reduce_reference(bools, ReduceOp::Avg), UsageError);
  std::vector<at::Tensor> floats{at::tensor({1.0f}), at::tensor({2.0f})};
  EXPECT_FLOAT_EQ(comm::reduce_reference(floats, ReduceOp::Avg).item<float>(), 1.5f);
  EXPECT_THROW(comm::parse_reduce_op("median"), UsageError);
  // The inputs are left alone.
  EXPECT_EQ(floats[0].item<float>(), 1.0f);
}
