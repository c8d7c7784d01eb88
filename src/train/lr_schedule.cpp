#include "crosstrain/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace crosstrain::train {

double learning_rate(int64_t step, int64_t warmup_steps, int64_t total_steps, double lr, double min_lr) {
  if (step <= warmup_steps && warmup_steps > 0) return lr * static_cast<double>(step) / static_cast<double>(warmup_steps);
  if (total_steps <= warmup_steps) return lr;
  const double progress =
      std::clamp(static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps), 0.0, 1.0);
  return min_lr + 0.5 * (1.0 + std::cos(M_PI * progress)) * (lr - min_lr);
}

}  // namespace crosstrain::train
