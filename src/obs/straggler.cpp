#include "crosstrain/obs/straggler.h"

#include <algorithm>
#include <cstdio>

#include "crosstrain/obs/median.h"

namespace crosstrain::obs {
namespace {

double median_of_others(const std::vector<double>& values, size_t skip, const std::vector<int>& peers) {
  std::vector<double> others;
  for (size_t i = 0; i < values.size(); ++i)
    if (i != skip && (peers.empty() || peers[i] == peers[skip])) others.push_back(values[i]);
  return others.empty() ? values[skip] : median(others);
}

}  // namespace

double median_step(const std::vector<double>& busy_per_step) { return median(busy_per_step); }

StragglerVerdict StragglerDetector::update(const std::vector<double>& busy_s, const std::vector<int>& peers) {
  StragglerVerdict v;
  v.busy_s = busy_s;
  above_.resize(busy_s.size(), 0);
  below_.resize(busy_s.size(), 0);
  for (size_t r = 0; r < busy_s.size(); ++r) {
    const double others = median_of_others(busy_s, r, peers.size() == busy_s.size() ? peers : std::vector<int>{});
    v.scores.push_back(others > 0 ? busy_s[r] / others : 1.0);
    const bool slow = v.scores[r] > 1 + margin_ && busy_s[r] - others >= min_excess_s_;
    above_[r] = slow ? above_[r] + 1 : 0;
    below_[r] = slow ? 0 : below_[r] + 1;
  }
  // Named after `windows` slow exchanges in a row, cleared after as many normal ones (one noisy window flips
  // neither way); of several, the slowest, as the others wait for it.
  int named = straggler_ >= 0 && straggler_ < static_cast<int>(busy_s.size()) && below_[straggler_] < windows_
                  ? straggler_
                  : -1;
  for (size_t r = 0; r < busy_s.size(); ++r)
    if (busy_s.size() > 1 && above_[r] >= windows_ && (named < 0 || v.scores[r] > v.scores[named]))
      named = static_cast<int>(r);
  v.straggler = named;
  v.named_now = named >= 0 && named != straggler_;
  v.cleared_now = straggler_ >= 0 && named != straggler_;
  v.previous = straggler_;
  straggler_ = named;
  return v;
}

std::string straggler_warning(const StragglerVerdict& v, long long first_step, long long last_step) {
  char text[256];
  if (v.straggler < 0) {
    std::snprintf(text, sizeof text, "straggler: rank %d is no longer slower than the others (steps %lld-%lld)",
                  v.previous, first_step, last_step);
    return text;
  }
  const size_t r = static_cast<size_t>(v.straggler);
  const double others = v.scores[r] > 0 ? v.busy_s[r] / v.scores[r] : 0;
  std::snprintf(text, sizeof text,
                "straggler: rank %d is busy %.2fx the median of the others (%.1f ms vs %.1f ms a step) over steps "
                "%lld-%lld; every collective waits for it",
                v.straggler, v.scores[r], 1000 * v.busy_s[r], 1000 * others, first_step, last_step);
  return text;
}

}  // namespace crosstrain::obs
