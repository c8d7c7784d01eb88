// What this process holds right now: resident memory, threads and open files (from /proc/self). Elastic training
// prints it at its first generation and at its end, so that a run with many failures shows whether anything
// accumulated.
#pragma once

#include <cstdint>
#include <string>

namespace crosstrain::obs {

struct ProcessFootprint {
  int64_t rss_bytes = 0;
  int threads = 0;
  int open_files = 0;
};

ProcessFootprint process_footprint();
// "rss 312 MB, 14 threads, 41 open files"
std::string describe(const ProcessFootprint& f);

}  // namespace crosstrain::obs
