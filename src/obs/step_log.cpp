#include "crosstrain/obs/step_log.h"

#include <nlohmann/json.hpp>

#include <algorithm>

namespace crosstrain::obs {
namespace {

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

}  // namespace

std::string metrics_row(const StepMetrics& m) {
  nlohmann::json row = {{"step", m.step},
                        {"loss", m.loss},
                        {"lr", m.lr},
                        {"grad_norm", m.grad_norm},
                        {"tokens_per_s", m.tokens_per_s},
                        {"mfu", m.mfu},
                        {"step_time_s", m.step_time_s},
                        {"comm_time_s", m.comm_time_s},
                        {"exposed_comm_time_s", m.exposed_comm_time_s}};
  if (m.val_loss >= 0) row["val_loss"] = m.val_loss;
  for (const auto& [key, value] : m.extra) row[key] = value;
  for (const auto& [key, value] : m.counts) row[key] = value;
  for (const auto& [key, value] : m.labels) row[key] = value;
  for (const auto& [key, values] : m.series) row[key] = values;
  return row.dump();
}

std::string progress_line(const StepMetrics& m) {
  return "step " + std::to_string(m.step) + "/" + std::to_string(m.total_steps) + " | loss " + fmt("%.4f", m.loss) +
         (m.val_loss >= 0 ? " | val " + fmt("%.4f", m.val_loss) : "") + " | lr " + fmt("%.2e", m.lr) + " | " +
         fmt("%.0f", m.tokens_per_s) + " " + m.unit + "/s" + (m.mfu > 0 ? " | mfu " + fmt("%.1f%%", 100 * m.mfu) : "") +
         " | comm " + fmt("%.0f", 1000 * m.comm_time_s) + " ms (exposed " + fmt("%.0f", 1000 * m.exposed_comm_time_s) +
         ")" + (m.note.empty() ? "" : " | " + m.note);
}

void ProgressPrinter::print(const StepMetrics& m) {
  const std::string line = progress_line(m);
  if (bar_) {
    const int width = 24;
    const int filled = static_cast<int>(width * m.step / std::max<int64_t>(1, m.total_steps));
    const std::string bar = "[" + std::string(filled, '=') + std::string(width - filled, ' ') + "] ";
    std::fprintf(out_, "\r%s%s\033[K", bar.c_str(), line.c_str());
    open_line_ = true;
    if (m.step == m.total_steps || m.val_loss >= 0) finish();
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

void ProgressPrinter::finish() {
  if (open_line_) std::fprintf(out_, "\n");
  open_line_ = false;
  std::fflush(out_);
}

}  // namespace crosstrain::obs
