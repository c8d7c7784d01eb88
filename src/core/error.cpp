#include "crosstrain/core/error.h"

#include <sstream>

namespace crosstrain {

std::string describe(const CommContext& c, const std::string& cause) {
  std::ostringstream out;
  if (c.rank >= 0) out << "[rank " << c.rank << "] ";
  out << (c.op.empty() ? std::string("operation") : c.op);
  if (!c.group.empty()) {
    out << " on group '" << c.group << "'";
    if (c.group_size > 0) out << " (" << c.group_size << (c.group_size == 1 ? " rank)" : " ranks)");
  }
  if (c.peer >= 0) out << ", peer " << c.peer;
  if (c.step) out << ", step " << *c.step;
  out << ": " << cause;
  if (c.timeout) {
    auto ms = c.timeout->count();
    if (ms % 1000 == 0)
      out << " (timeout " << ms / 1000 << " s)";
    else
      out << " (timeout " << ms << " ms)";
  }
  return out.str();
}

CommError::CommError(CommContext context, const std::string& cause, bool timed_out)
    : Error(describe(context, cause)), context_(std::move(context)), cause_(cause), timed_out_(timed_out) {}

}  // namespace crosstrain
