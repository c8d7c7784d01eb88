#include "crosstrain/core/machine.h"

#include <fstream>
#include <sstream>
#include <string>

namespace crosstrain {

int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  // One "Key:   value [kB]" a line; some lines (HugePages_Total) have no unit, so read line by line.
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string key;
    int64_t kib = -1;
    if (fields >> key >> kib && key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

}  // namespace crosstrain
