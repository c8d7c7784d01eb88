#include "error_line.h"

#include <sstream>

namespace crosstrain::apps {

std::string error_line(const std::string& what, const std::string& fallback) {
  std::istringstream in(what);
  for (std::string line; std::getline(in, line);) {
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos) continue;
    const auto last = line.find_last_not_of(" \t\r");
    return line.substr(first, last - first + 1);
  }
  return fallback;
}

}  // namespace crosstrain::apps
