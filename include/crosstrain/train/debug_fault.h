// Private to src/train: the debug switches that fire on one rank at one step ("RANK@STEP" or "all@STEP"):
// debug.elastic_kill, debug.elastic_stop, debug.skip_collective.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

#include "crosstrain/core/error.h"

namespace crosstrain::train {

struct DebugFault {
  int rank = -2;  // -1: every rank; -2: no fault
  int64_t step = -1;
  bool hits(int r, int64_t s) const { return step == s && (rank == -1 || rank == r); }
  // The step at which it fires on rank `r` (-1: never).
  int64_t step_for(int r) const { return rank == -1 || rank == r ? step : -1; }
};

// `key` names the switch in the message of a malformed spec.
inline DebugFault parse_debug_fault(const std::string& spec, const char* key) {
  DebugFault f;
  if (spec.empty()) return f;
  const auto at = spec.find('@');
  try {
    if (at == std::string::npos) throw std::invalid_argument(spec);
    const std::string who = spec.substr(0, at);
    f.rank = who == "all" ? -1 : std::stoi(who);
    f.step = std::stoll(spec.substr(at + 1));
  } catch (const std::exception&) {
    throw UsageError(std::string("debug.") + key + " = '" + spec + "': use RANK@STEP or all@STEP, e.g. 2@7");
  }
  return f;
}

}  // namespace crosstrain::train
