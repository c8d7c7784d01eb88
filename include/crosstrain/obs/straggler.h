// Online straggler detection (pure): every few steps the ranks share their busy time per step (step time not
// spent blocked in communication; the median step of the window, so that one step preempted by the OS does not
// count); a rank busier than the median of the others by a margin, in several exchanges
// in a row, is named. In lockstep training every rank's step takes as long as the slowest's, so busy time, not
// step time, tells them apart: the straggler computes while the others wait for it.
#pragma once

#include <string>
#include <vector>

namespace crosstrain::obs {

struct StragglerVerdict {
  std::vector<double> busy_s;  // each rank's busy seconds per step over the window
  std::vector<double> scores;  // busy time over the median of the other ranks' of its stage (1: as busy as they)
  int straggler = -1;          // the rank named (-1: none)
  bool named_now = false;      // it became the straggler in this exchange (print the warning)
  bool cleared_now = false;    // the previous straggler is no longer one
  int previous = -1;           // the rank that cleared_now refers to
};

class StragglerDetector {
 public:
  // `margin`: 0.25 names a rank 25% busier than the others' median, when that is also `min_excess_s` or more
  // (a millisecond of scheduling noise is 30% of a 3 ms step); `windows`: exchanges in a row.
  StragglerDetector(double margin, int windows, double min_excess_s = 0)
      : margin_(margin), windows_(windows), min_excess_s_(min_excess_s) {}
  // `peers`: a class per rank (the pipeline stage); a rank is compared with the others of its class only, since
  // stages do different work (empty: one class). A rank alone in its class scores 1.
  StragglerVerdict update(const std::vector<double>& busy_s, const std::vector<int>& peers = {});
  int straggler() const { return straggler_; }

 private:
  double margin_;
  int windows_;
  double min_excess_s_;
  std::vector<int> above_, below_;  // exchanges in a row above / not above the bar, per rank
  int straggler_ = -1;
};

// The median of a window's per-step busy times (what a rank shares).
double median_step(const std::vector<double>& busy_per_step);

// "straggler: rank 1 is busy 1.92x the median of the others (61.0 ms vs 31.8 ms a step) over steps 6-10"
std::string straggler_warning(const StragglerVerdict& v, long long first_step, long long last_step);

}  // namespace crosstrain::obs
