// metrics.jsonl: one JSON object per line, flushed as written so a crash loses at most the current line.
#pragma once

#include <fstream>
#include <string>

namespace crosstrain::obs {

class MetricsWriter {
 public:
  // Opens `path`; when `keep_before_step` > 0, keeps the existing rows with a smaller "step" (a resumed run
  // replaces what the interrupted one wrote after its checkpoint) and drops the rest.
  MetricsWriter(const std::string& path, int64_t keep_before_step);
  void write(const std::string& json_line);
  // The largest "step" among the rows kept when it opened (0: none).
  int64_t last_kept_step() const { return last_kept_step_; }

 private:
  std::ofstream out_;
  int64_t last_kept_step_ = 0;
};

// Peak resident memory of this process, in bytes (VmHWM).
int64_t peak_rss_bytes();

}  // namespace crosstrain::obs
