// The one line a failed command prints: never empty, never a backtrace.
#pragma once

#include <string>

namespace crosstrain::apps {

// The first non-blank line of `what` (libtorch and Gloo messages may start with a newline or carry a backtrace
// after it); `fallback` when every line is blank, so that no "crosstrain: error:" line is ever empty.
std::string error_line(const std::string& what, const std::string& fallback);

}  // namespace crosstrain::apps
