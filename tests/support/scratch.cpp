#include "scratch.h"

#include <unistd.h>

namespace crosstrain::testing {

std::filesystem::path scratch_path(const std::string& tag) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("ct-" + std::to_string(::getpid()) + "-" + tag);
  std::filesystem::remove_all(path);
  return path;
}

std::filesystem::path scratch_dir(const std::string& tag) {
  const std::filesystem::path dir = scratch_path(tag);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace crosstrain::testing
