#include "crosstrain/core/fence.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "crosstrain/core/error.h"

namespace crosstrain {
namespace fs = std::filesystem;

void write_fence(const std::string& run_dir, const std::string& token) {
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  const fs::path file = fs::path(run_dir) / "FENCE", tmp = fs::path(run_dir) / "FENCE.tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << token << "\n";
    if (!out.flush()) throw Error("cannot write the fence " + tmp.string() + ": " + std::strerror(errno));
  }
  fs::rename(tmp, file, ec);
  if (ec) throw Error("cannot put the fence in place at " + file.string() + ": " + ec.message());
}

std::string fence_refusal(const std::string& run_dir, const std::string& token) {
  if (token.empty()) return "";
  const fs::path file = fs::path(run_dir) / "FENCE";
  std::ifstream in(file);
  std::string holder;
  if (!in || !std::getline(in, holder))
    return "the run folder has no fence " + file.string() + " for placement '" + token +
           "': it was not started by the scheduler that owns it";
  if (holder == token) return "";
  return "placement '" + token + "' was fenced off: " + file.string() + " names '" + holder +
         "', which took the job over (this one was declared lost); its checkpoint is not committed";
}

}  // namespace crosstrain
