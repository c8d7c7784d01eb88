#include "crosstrain/obs/footprint.h"

#include <dirent.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "crosstrain/obs/trace.h"

namespace crosstrain::obs {
namespace {

int threads_of_this_process() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  return 0;
}

int entries_of(const char* dir) {
  DIR* d = opendir(dir);
  if (!d) return 0;
  int n = 0;
  while (const dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n - 1;  // less the descriptor of the listing itself
}

}  // namespace

ProcessFootprint process_footprint() {
  ProcessFootprint f;
  f.rss_bytes = rss_bytes();
  f.threads = threads_of_this_process();
  f.open_files = entries_of("/proc/self/fd");
  return f;
}

std::string describe(const ProcessFootprint& f) {
  char text[120];
  std::snprintf(text, sizeof text, "rss %lld MB, %d threads, %d open files",
                static_cast<long long>(f.rss_bytes >> 20), f.threads, f.open_files);
  return text;
}

}  // namespace crosstrain::obs
