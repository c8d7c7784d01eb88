#include "peak_flops.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <thread>

#include "crosstrain/core/error.h"

namespace crosstrain::train {

std::vector<GemmShape> gpt_gemm_shapes(const models::GPTConfig& model, int64_t tokens_per_micro_batch) {
  if (tokens_per_micro_batch < 1)
    throw UsageError("MFU peak: " + std::to_string(tokens_per_micro_batch) +
                     " tokens per micro-batch; train.global_batch must leave each micro-batch a sequence");
  const int64_t t = tokens_per_micro_batch, d = model.n_embd;
  return {{"qkv", t, d, 3 * d, true},
          {"proj", t, d, d, true},
          {"mlp_up", t, d, 4 * d, true},
          {"mlp_down", t, 4 * d, d, true},
          {"head", t, d, model.vocab_size, false}};
}

GemmPeak measure_gemm_peak(const models::GPTConfig& model, int64_t tokens_per_micro_batch, at::ScalarType dtype,
                           double seconds_per_shape) {
  GemmPeak peak;
  for (const GemmShape& s : gpt_gemm_shapes(model, tokens_per_micro_batch)) {
    const double flops = obs::time_gemm(s, dtype, seconds_per_shape);
    peak.by_shape.emplace_back(s.describe(), flops);
    if (flops > peak.best_flops) {
      peak.best_flops = flops;
      peak.best_shape = s.describe();
    }
  }
  return peak;
}

GemmPeak measure_in_turns_per_host(const std::function<GemmPeak()>& measure, const std::string& lock_path,
                                   std::chrono::milliseconds wait) {
  // Never through a link someone else planted in /tmp (O_NOFOLLOW, and a plain file with one name), and anyone's
  // to take (0666 despite the umask): another user's job on this host shares its cores too.
  int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd < 0) fd = ::open(lock_path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);  // flock needs no write access
  struct stat st {};
  if (fd >= 0 && (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1)) {
    ::close(fd);
    fd = -1;
  }
  if (fd >= 0 && st.st_uid == ::geteuid()) (void)::fchmod(fd, 0666);
  // A lock not had by the deadline is given up on: measured without it, the run goes on.
  const auto deadline = std::chrono::steady_clock::now() + wait;
  while (fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) != 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  GemmPeak peak;
  try {
    peak = measure();
  } catch (...) {
    if (fd >= 0) ::close(fd);  // closing releases the lock
    throw;
  }
  if (fd >= 0) ::close(fd);
  return peak;
}

GemmPeak measure_model_peak(const Config& c, int64_t micro_batch) {
  const at::ScalarType dtype = c.train.precision == "bf16" ? at::kBFloat16 : at::kFloat;
  return measure_in_turns_per_host([&] { return measure_gemm_peak(c.model, micro_batch * c.model.block_size, dtype); },
                                   "/tmp/crosstrain-gemm-peak.lock", c.comm.timeout() / 4);
}

std::string describe(const GemmPeak& peak) {
  char head[160];
  std::snprintf(head, sizeof head, "best %.2f GFLOP/s (%s)", peak.best_flops / 1e9, peak.best_shape.c_str());
  std::string text = head;
  for (size_t i = 0; i < peak.by_shape.size(); ++i) {
    char part[160];
    std::snprintf(part, sizeof part, "%s%s %.2f", i == 0 ? "; " : ", ", peak.by_shape[i].first.c_str(),
                  peak.by_shape[i].second / 1e9);
    text += part;
  }
  return text + " GFLOP/s";
}

}  // namespace crosstrain::train
