#include "crosstrain/core/fence.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

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

namespace {

// "job7.a3" -> ("job7", 3); attempt -1 when the token is not of that form.
std::pair<std::string, long long> placement_of(const std::string& token) {
  const size_t dot = token.rfind(".a");
  if (dot == std::string::npos || dot == 0 || dot + 2 >= token.size() || token.size() - dot > 12) return {token, -1};
  const std::string digits = token.substr(dot + 2);
  if (digits.find_first_not_of("0123456789") != std::string::npos) return {token, -1};
  return {token.substr(0, dot), std::stoll(digits)};
}

std::string fence_holder(const fs::path& file) {
  std::ifstream in(file);
  std::string holder;
  if (in) std::getline(in, holder);
  return holder;
}

}  // namespace

bool fence_is_later(const std::string& a, const std::string& b) {
  const auto [job_a, attempt_a] = placement_of(a);
  const auto [job_b, attempt_b] = placement_of(b);
  return attempt_a >= 0 && attempt_b >= 0 && job_a == job_b && attempt_a > attempt_b;
}

std::string advance_fence(const std::string& run_dir, const std::string& token) {
  if (token.empty()) return "";
  std::error_code ec;
  fs::create_directories(run_dir, ec);
  const fs::path lock_path = fs::path(run_dir) / "FENCE.lock";
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("cannot open the fence's lock " + lock_path.string() + ": " + std::strerror(errno));
  // Bounded: the lock is held for one read and one small write.
  bool locked = false;
  for (int i = 0; i < 300 && !(locked = ::flock(fd, LOCK_EX | LOCK_NB) == 0); ++i) ::usleep(100 * 1000);
  if (!locked) {
    ::close(fd);
    throw Error("the fence's lock " + lock_path.string() + " was held for 30 s; is a process stuck there?");
  }
  std::string refusal;
  try {
    const std::string holder = fence_holder(fs::path(run_dir) / "FENCE");
    if (holder.empty() || fence_is_later(token, holder)) {
      write_fence(run_dir, token);
    } else if (holder != token) {
      refusal = "placement '" + token + "' was fenced off at " + run_dir + ": its FENCE names '" + holder + "'" +
                (fence_is_later(holder, token) ? ", a later placement of the job, which took it over (this one was "
                                                 "declared lost)"
                                               : ", not an earlier placement of this job (another job's folder?)");
    }
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return refusal;
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
