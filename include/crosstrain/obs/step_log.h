// What a training step reports: the metrics row (metrics.jsonl, one JSON object per step) and the progress line a
// person reads. Plain numbers in, text out: the trainer fills a StepMetrics, this file decides the format.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace crosstrain::obs {

struct StepMetrics {
  int64_t step = 0, total_steps = 0;
  double loss = 0;
  double val_loss = -1;  // -1: no validation this step
  double lr = 0, grad_norm = 0;
  double tokens_per_s = 0, mfu = 0;
  double step_time_s = 0, comm_time_s = 0, exposed_comm_time_s = 0;
  // Everything else the row carries (tokens, memory, checkpoint time, sync-mode figures, ...), by name.
  std::map<std::string, double> extra;
  std::map<std::string, int64_t> counts;       // whole numbers: bytes, exchanges
  std::map<std::string, std::string> labels;  // text fields, e.g. sync_mode
  std::map<std::string, std::vector<double>> series;  // one value per rank, e.g. rank_busy_s, straggler_score
  // The progress line only (not the row): what tokens_per_s counts ("examples" for DLRM), and the family's own
  // figures at the end of the line.
  std::string unit = "tok";
  std::string note;
};

// One metrics.jsonl line (no newline).
std::string metrics_row(const StepMetrics& m);
// "step 10/40 | loss 2.3456 | val 2.4 | lr 1.00e-03 | 1234 tok/s | mfu 1.2% | comm 12 ms (exposed 3)"
std::string progress_line(const StepMetrics& m);

// Prints progress lines: on a terminal one redrawn line with a bar, otherwise plain lines.
class ProgressPrinter {
 public:
  ProgressPrinter(bool bar, std::FILE* out = stdout) : bar_(bar), out_(out) {}
  void print(const StepMetrics& m);
  // Ends a redrawn line (before other output).
  void finish();

 private:
  bool bar_;
  std::FILE* out_;
  bool open_line_ = false;
};

}  // namespace crosstrain::obs
