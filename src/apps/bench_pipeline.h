#pragma once

#include <string>
#include <vector>

namespace crosstrain::apps {

struct BenchPipelineOptions {
  std::vector<int> stages{2, 4};
  std::vector<int> microbatches{4, 8};
  std::vector<std::string> schedules{"gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2"};
  int layers = 8, width = 256, heads = 4, context = 128, batch = 4;  // batch: sequences per micro-batch
  int steps = 5;
  std::string trace_dir;  // when set: one Chrome/Perfetto trace per (schedule, p, m), a track per stage
};

// `crosstrain bench pipeline`: runs each schedule on real processes with the GPT and prints, per schedule and
// (p, m), the measured bubble next to the theory. Launches its own ranks per p. Returns the exit code.
int bench_pipeline(const BenchPipelineOptions& options, const std::vector<std::string>& relaunch_args);

}  // namespace crosstrain::apps
