// The embedding sharding planner: which tables stay whole, which are split by rows or columns, and the row blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "crosstrain/core/error.h"
#include "crosstrain/recsys/sharding_plan.h"

using namespace crosstrain::recsys;

namespace {

constexpr int64_t MiB = int64_t{1} << 20;

TableShape shape(int64_t rows, int64_t dim, double ids = 1) {
  TableShape t;
  t.rows = rows;
  t.dim = dim;
  t.ids_per_example = ids;
  return t;
}

std::string usage_error(const ShardingInputs& in) {
  try {
    plan_sharding(in);
  } catch (const crosstrain::UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(ShardingPlan, SmallTablesStayWholeAndSpreadEvenly) {
  ShardingInputs in;
  in.world = 4;
  in.budget_bytes_per_rank = 256 * MiB;
  for (int t = 0; t < 8; ++t) in.tables.push_back(shape(1000 + 100 * t, 16));
  const auto plan = plan_sharding(in);
  std::vector<int> tables_on(4, 0);
  for (const auto& p : plan) {
    EXPECT_EQ(p.sharding, Sharding::Table) << p.reason;
    EXPECT_NE(p.reason.find("table-wise on rank " + std::to_string(p.owner)), std::string::npos) << p.reason;
    ++tables_on[p.owner];
  }
  for (int r = 0; r < 4; ++r) EXPECT_EQ(tables_on[r], 2) << "rank " << r;
  // Largest first onto the least loaded: no rank holds more than the even share plus one table.
  const auto bytes = bytes_per_rank(in, plan);
  const int64_t total = std::accumulate(bytes.begin(), bytes.end(), int64_t{0});
  const int64_t largest = 1700 * 16 * in.bytes_per_row_element;
  for (int64_t b : bytes) EXPECT_LE(b, total / 4 + largest);
}

TEST(ShardingPlan, OneRankHoldsEverythingWhole) {
  ShardingInputs in;
  in.tables = {shape(1 << 20, 128, 3), shape(100, 8)};
  const auto plan = plan_sharding(in);
  for (const auto& p : plan) {
    EXPECT_EQ(p.sharding, Sharding::Table);
    EXPECT_EQ(p.owner, 0);
    EXPECT_EQ(p.reason, "one rank: table-wise on rank 0");
  }
}

TEST(ShardingPlan, ATableOverAQuarterOfTheBudgetIsSplitByRows) {
  ShardingInputs in;
  in.world = 4;
  in.budget_bytes_per_rank = 256 * MiB;
  in.tables = {shape(1000, 16), shape(410 * MiB / (16 * 8), 16), shape(2000, 16)};
  const auto plan = plan_sharding(in);
  EXPECT_EQ(plan[0].sharding, Sharding::Table);
  EXPECT_EQ(plan[1].sharding, Sharding::Row);
  EXPECT_EQ(plan[1].reason, "410 MiB > 25% of the 256 MiB budget: row-wise over 4 ranks");
  EXPECT_EQ(plan[2].sharding, Sharding::Table);
  for (int64_t b : bytes_per_rank(in, plan)) EXPECT_LE(b, in.budget_bytes_per_rank);
}

TEST(ShardingPlan, WithoutABudgetATableLargerThanTheEvenShareIsSplitByRows) {
  ShardingInputs in;
  in.world = 2;
  in.tables = {shape(1 << 20, 16), shape(1000, 16), shape(1000, 16)};  // 128 MiB beside two small ones
  const auto plan = plan_sharding(in);
  EXPECT_EQ(plan[0].sharding, Sharding::Row) << plan[0].reason;
  EXPECT_NE(plan[0].reason.find("even share"), std::string::npos) << plan[0].reason;
  EXPECT_EQ(plan[1].sharding, Sharding::Table);
  // Tiny tables are not split just because there are fewer of them than ranks.
  in.world = 4;
  in.tables = {shape(1000, 16), shape(1000, 16)};
  for (const auto& p : plan_sharding(in)) EXPECT_EQ(p.sharding, Sharding::Table) << p.reason;
}

TEST(ShardingPlan, AWideHotTableIsSplitByColumns) {
  ShardingInputs in;
  in.world = 4;
  in.tables = {shape(2000, 128, 3), shape(5000, 16), shape(5000, 16), shape(5000, 16)};
  const auto plan = plan_sharding(in);
  EXPECT_EQ(plan[0].sharding, Sharding::Column);
  EXPECT_EQ(plan[0].reason.rfind("dim 128, 3.0 lookups/example", 0), 0u) << plan[0].reason;
  EXPECT_NE(plan[0].reason.find("32 columns each"), std::string::npos) << plan[0].reason;
  for (size_t t = 1; t < plan.size(); ++t) EXPECT_EQ(plan[t].sharding, Sharding::Table);
  // As wide but rarely read (a small share of the traffic): whole.
  in.tables[0].ids_per_example = 0.05;
  EXPECT_EQ(plan_sharding(in)[0].sharding, Sharding::Table);
  // Hot but narrow: whole.
  in.tables[0] = shape(2000, 32, 30);
  EXPECT_EQ(plan_sharding(in)[0].sharding, Sharding::Table);
}

TEST(ShardingPlan, RequestedShardingsOnePerTableOrOneForAll) {
  ShardingInputs in;
  in.world = 2;
  in.tables = {shape(100, 8), shape(100, 8), shape(100, 8), shape(100, 8)};
  in.requested = "table, row,column ,auto";
  auto plan = plan_sharding(in);
  EXPECT_EQ(plan[0].sharding, Sharding::Table);
  EXPECT_EQ(plan[1].sharding, Sharding::Row);
  EXPECT_EQ(plan[2].sharding, Sharding::Column);
  EXPECT_EQ(plan[3].sharding, Sharding::Table);
  EXPECT_EQ(plan[1].reason, "requested row-wise over 2 ranks");
  in.requested = "row";
  for (const auto& p : plan_sharding(in)) EXPECT_EQ(p.sharding, Sharding::Row);
}

TEST(ShardingPlan, BadRequestsNameTheKey) {
  ShardingInputs in;
  in.world = 4;
  in.tables = {shape(100, 8), shape(100, 30)};
  in.requested = "row,diagonal";
  EXPECT_NE(usage_error(in).find("dlrm.sharding"), std::string::npos);
  EXPECT_NE(usage_error(in).find("'diagonal'"), std::string::npos) << usage_error(in);
  in.requested = "row,row,row";
  EXPECT_NE(usage_error(in).find("3 shardings for 2 tables"), std::string::npos) << usage_error(in);
  in.requested = "row,column";  // dim 30 over 4 ranks
  EXPECT_NE(usage_error(in).find("table 1 has dim 30"), std::string::npos) << usage_error(in);
  EXPECT_THROW(parse_sharding("rows"), crosstrain::UsageError);
  EXPECT_EQ(parse_sharding(sharding_name(Sharding::Column)), Sharding::Column);
}

TEST(ShardingPlan, OverBudgetNamesTheTableItsBytesAndTheBudget) {
  ShardingInputs in;
  in.world = 2;
  in.budget_bytes_per_rank = 100 * MiB;
  in.tables = {shape(1000, 16), shape(300 * MiB / (16 * 8), 16)};  // 300 MiB: 150 MiB per rank even split
  const std::string message = usage_error(in);
  EXPECT_NE(message.find("table 1 (300 MiB"), std::string::npos) << message;
  EXPECT_NE(message.find("100 MiB budget"), std::string::npos) << message;
  // A whole table requested where no rank has room.
  // 80 MiB of table 0 on each rank leaves 20 MiB: 24 MiB whole fits nowhere, 12 MiB a rank does.
  in.tables = {shape(160 * MiB / (16 * 8), 16), shape(24 * MiB / (16 * 8), 16)};
  in.requested = "row,table";
  EXPECT_NE(usage_error(in).find("table 1 (24.0 MiB) table-wise"), std::string::npos) << usage_error(in);
  // ... which auto splits instead.
  in.requested = "row,auto";
  const auto plan = plan_sharding(in);
  EXPECT_EQ(plan[1].sharding, Sharding::Row);
  EXPECT_EQ(plan[1].reason, "24.0 MiB fits no rank whole beside the other tables: row-wise over 2 ranks");
}

TEST(RowBlocks, CoverEveryRowOnceAndAgreeWithRowOwner) {
  for (int64_t rows : {0, 1, 3, 7, 8, 100, 1001}) {
    for (int world : {1, 2, 3, 4, 8}) {
      int64_t next = 0;
      for (int r = 0; r < world; ++r) {
        const RowRange b = row_block(rows, r, world);
        EXPECT_EQ(b.first, next) << rows << " rows, rank " << r << " of " << world;
        const int64_t size = b.last - b.first;
        EXPECT_TRUE(size == rows / world || size == rows / world + 1);
        EXPECT_EQ(size == rows / world + 1, r < rows % world);
        for (int64_t row = b.first; row < b.last; ++row) EXPECT_EQ(row_owner(row, rows, world), r);
        next = b.last;
      }
      EXPECT_EQ(next, rows);
    }
  }
  EXPECT_THROW(row_owner(10, 10, 2), crosstrain::Error);
}

TEST(BytesPerRank, FollowsEachSharding) {
  ShardingInputs in;
  in.world = 4;
  in.bytes_per_row_element = 4;
  in.tables = {shape(10, 8), shape(10, 8), shape(10, 8)};
  const std::vector<TablePlacement> plan = {{Sharding::Table, 2, ""}, {Sharding::Row, 0, ""},
                                            {Sharding::Column, 0, ""}};
  // Whole: 320 bytes on rank 2; rows 3,3,2,2 x 32 bytes; columns 2 each x 10 rows x 4 bytes = 80.
  EXPECT_EQ(bytes_per_rank(in, plan), (std::vector<int64_t>{96 + 80, 96 + 80, 320 + 64 + 80, 64 + 80}));
}
