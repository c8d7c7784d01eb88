#include <gtest/gtest.h>

#include <algorithm>

#include <ATen/ATen.h>

#include "../../src/apps/bench_comm.h"
#include "../../src/apps/error_line.h"
#include "../../src/apps/launcher.h"
#include "../../src/apps/line_folder.h"
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

TEST(ErrorLine, FirstNonBlankLineNeverEmpty) {
  EXPECT_EQ(apps::error_line("bad thing\nbacktrace...", "x"), "bad thing");
  EXPECT_EQ(apps::error_line("\n  \n  gloo: timed out \nmore", "x"), "gloo: timed out");
  EXPECT_EQ(apps::error_line("", "fallback"), "fallback");
  EXPECT_EQ(apps::error_line("\n\n \t\n", "fallback"), "fallback");
}

TEST(RanksFit, RefusesWhatCannotFitWithTheFigures) {
  apps::MachineRoom room;
  room.available_bytes = 10LL << 30;
  room.free_tasks = 100;
  room.task_limit = "this user's process limit (ulimit -u)";
  const apps::RankNeeds rank{1LL << 30, 8};
  EXPECT_NO_THROW(apps::check_ranks_fit(10, rank, room));  // 10 GiB, 80 tasks: fits exactly
  try {
    apps::check_ranks_fit(11, rank, room);
    FAIL() << "11 ranks of 1 GiB fit 10 GiB";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("11.0 GiB"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("use at most --nproc 10"), std::string::npos) << e.what();
  }
  room.available_bytes = 100LL << 30;
  try {
    apps::check_ranks_fit(13, rank, room);
    FAIL() << "13 ranks of 8 tasks fit 100 tasks";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("ulimit -u"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("use at most --nproc 12"), std::string::npos) << e.what();
  }
  // The launcher's own store threads count too: 12 ranks (96 tasks) fit 100, not with 5 more.
  EXPECT_NO_THROW(apps::check_ranks_fit(12, rank, room, 4));
  EXPECT_THROW(apps::check_ranks_fit(12, rank, room, 5), UsageError);
  room.available_bytes = room.free_tasks = -1;  // unknown: nothing to refuse
  EXPECT_NO_THROW(apps::check_ranks_fit(1000, rank, room));
  room.available_bytes = 1LL << 20;  // not even one rank
  EXPECT_THROW(apps::check_ranks_fit(1, rank, room), UsageError);
}

TEST(RankList, JoinsRuns) {
  EXPECT_EQ(apps::rank_list({3, 0, 1, 2}), "0-3");
  EXPECT_EQ(apps::rank_list({7, 0, 2, 5, 6}), "0,2,5-7");
  EXPECT_EQ(apps::rank_list({4}), "4");
  EXPECT_EQ(apps::rank_list({}), "");
}

TEST(LineFolder, ARankThatFloodsItsOwnLinesHoldsNoMoreThanABoundAndLosesNone) {
  const auto t0 = apps::LineFolder::Clock::now();
  apps::LineFolder folder(std::chrono::milliseconds(200), 2);
  size_t printed = 0, most_held = 0;
  for (int i = 0; i < 2000; ++i) {
    printed += folder.offer(0, "crosstrain: line " + std::to_string(i), t0).size();
    most_held = std::max(most_held, static_cast<size_t>(i + 1) - printed);
  }
  EXPECT_LE(most_held, 256u);
  const auto rest = folder.flush();
  EXPECT_EQ(printed + rest.size(), 2000u);
  EXPECT_EQ(rest.back(), "[rank 0] crosstrain: line 1999");
}

TEST(LineFolder, WhatEveryRankPrintsAlikeComesOnceWithItsRanks) {
  using std::chrono::milliseconds;
  const auto t0 = apps::LineFolder::Clock::now();
  apps::LineFolder folder(milliseconds(200), 3);
  // A program's own lines pass at once, with their rank.
  EXPECT_EQ(folder.offer(1, "loss 3.2", t0), std::vector<std::string>{"[rank 1] loss 3.2"});
  // crosstrain's lines wait for their copies; all three ranks: printed at once, folded.
  EXPECT_TRUE(folder.offer(2, "crosstrain: error: bad key", t0).empty());
  EXPECT_TRUE(folder.offer(0, "crosstrain: error: bad key", t0).empty());
  EXPECT_EQ(folder.offer(1, "crosstrain: error: bad key", t0),
            std::vector<std::string>{"[ranks 0-2] crosstrain: error: bad key"});
  // Two of three: held until the moment is over.
  EXPECT_TRUE(folder.offer(0, "crosstrain: warning: w", t0).empty());
  EXPECT_TRUE(folder.offer(2, "crosstrain: warning: w", t0 + milliseconds(50)).empty());
  EXPECT_TRUE(folder.due(t0 + milliseconds(150)).empty());
  EXPECT_EQ(folder.due(t0 + milliseconds(250)), std::vector<std::string>{"[ranks 0,2] crosstrain: warning: w"});
  // A rank that says the same twice is two lines, not one line of one rank counted twice.
  EXPECT_TRUE(folder.offer(1, "crosstrain: step", t0).empty());
  EXPECT_TRUE(folder.offer(1, "crosstrain: step", t0).empty());
  EXPECT_EQ(folder.flush(), (std::vector<std::string>{"[rank 1] crosstrain: step", "[rank 1] crosstrain: step"}));
  EXPECT_TRUE(folder.flush().empty());
}
