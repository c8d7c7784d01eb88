// Scratch directories for tests: one place that decides where a test's files go and that they start empty.
#pragma once

#include <filesystem>
#include <string>

namespace crosstrain::testing {

// A fresh, empty directory for `tag`, under the system's temporary directory and named after this process
// ("ct-PID-TAG": a tag's extension stays last), so that ctest's parallel test processes never share one.
// Whatever was there is removed first.
std::filesystem::path scratch_dir(const std::string& tag);
// The same path, left absent: for what the code under test creates itself (a run folder, an export target).
std::filesystem::path scratch_path(const std::string& tag);

}  // namespace crosstrain::testing
