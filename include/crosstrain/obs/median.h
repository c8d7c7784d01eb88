// The median, shared by the online straggler detector, the trace analysis and the report (header-only: the
// report's torn-free test compiles those sources without the obs library).
#pragma once

#include <algorithm>
#include <vector>

namespace crosstrain::obs {

// 0 for no values.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

}  // namespace crosstrain::obs
