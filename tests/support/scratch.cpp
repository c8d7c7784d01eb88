#include "scratch.h"

#include <unistd.h>

namespace crosstrain::testing {

std::filesystem::path scratch_dir(const std::string& tag) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("ct-" + tag + "-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace crosstrain::testing
