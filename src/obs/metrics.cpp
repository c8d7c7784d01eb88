#include "crosstrain/obs/metrics.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <sstream>
#include <vector>

#include "crosstrain/core/error.h"

namespace crosstrain::obs {

MetricsWriter::MetricsWriter(const std::string& path, int64_t keep_before_step) {
  std::vector<std::string> kept;
  if (keep_before_step > 0) {
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      try {
        auto row = nlohmann::json::parse(line);
        const int64_t step = row.value("step", int64_t{0});
        if (step >= keep_before_step) continue;
        kept.push_back(line);
        last_kept_step_ = std::max(last_kept_step_, step);
      } catch (const nlohmann::json::exception&) {
        // A torn last line from a crash: drop it.
      }
    }
  }
  out_.open(path, std::ios::trunc);
  if (!out_) throw UsageError("cannot write metrics file '" + path + "'");
  for (const auto& line : kept) out_ << line << "\n";
  out_.flush();
}

void MetricsWriter::write(const std::string& json_line) {
  out_ << json_line << "\n";
  out_.flush();
}

int64_t peak_rss_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      int64_t kb = 0;
      fields >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

}  // namespace crosstrain::obs
