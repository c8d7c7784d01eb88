// The rendezvous store's table: c10d's add on decimal text, refused rather than wrapped on overflow.
#include <gtest/gtest.h>

#include <limits>
#include <stdexcept>

#include "crosstrain/store/table.h"

using namespace crosstrain::comm::store;

TEST(StoreTable, AddRefusesADeltaThatWouldOverflow) {
  StoreTable table;
  const int64_t max = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(table.add("n", max - 1), max - 1);
  EXPECT_THROW(table.add("n", 2), std::overflow_error);  // a hostile delta: undefined behaviour before
  EXPECT_EQ(*table.get("n"), std::to_string(max - 1)) << "the key must be unchanged";
  EXPECT_EQ(table.add("n", 1), max);
  EXPECT_EQ(table.add("m", std::numeric_limits<int64_t>::min()), std::numeric_limits<int64_t>::min());
  EXPECT_THROW(table.add("m", -1), std::overflow_error);
}
