// Learning-rate schedule: linear warmup, then cosine decay to min_lr. Pure.
#pragma once

#include <cstdint>

namespace crosstrain::train {

// `step` counts from 1. Warmup reaches lr at step warmup_steps; cosine reaches min_lr at total_steps.
double learning_rate(int64_t step, int64_t warmup_steps, int64_t total_steps, double lr, double min_lr);

}  // namespace crosstrain::train
