// Facts about the machine, read from the kernel.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "crosstrain/core/machine.h"

TEST(Machine, AvailableMemoryIsMemAvailableInBytes) {
  std::ifstream in("/proc/meminfo");
  if (!in) GTEST_SKIP() << "no /proc/meminfo here";
  int64_t kib = -1;
  for (std::string key; in >> key;) {
    if (key == "MemAvailable:") in >> kib;
    in.ignore(1 << 10, '\n');
  }
  const int64_t bytes = crosstrain::available_memory_bytes();
  ASSERT_GT(kib, 0);
  // Read a moment apart, the two figures differ by what other processes did meanwhile: within 5%.
  EXPECT_GT(bytes, 0);
  EXPECT_NEAR(static_cast<double>(bytes), kib * 1024.0, 0.05 * kib * 1024.0);
}
