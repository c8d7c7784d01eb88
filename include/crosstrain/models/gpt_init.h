// The GPT's initial parameters as a pure function of (seed, parameter name, shape): each parameter is drawn
// from its own generator, seeded from the run's seed and a stable hash of its name, with the distribution the
// parallel plan gives it (parallel_plan.h: Init, init_std). So the single-device GPT and every pipeline stage
// and tensor-parallel rank produce exactly the parameters they hold, one full tensor at a time, and a rank
// never builds the whole model to cut its shard from it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "crosstrain/models/parallel_plan.h"

namespace crosstrain::models {

// The generator seed of parameter `name` under the run's `seed`: stable across platforms, builds and
// processes (FNV-1a of the name, mixed with the seed by splitmix64).
uint64_t parameter_seed(uint64_t seed, const std::string& name);

// Fills `out` (fp32, the parameter's full shape) with p's initial value under `seed`.
void fill_initial(at::Tensor& out, const ParameterPlan& p, uint64_t seed);

// Tensor-parallel rank `tp_rank` of `tp_size`'s slice of `full` (p's whole tensor): a view when the shard is
// one range, `full` itself when p is replicated.
at::Tensor shard_of(const ParameterPlan& p, const at::Tensor& full, int tp_rank, int tp_size);

// Tensor-parallel rank `tp_rank` of `tp_size`'s shard of p's initial value: draws the full parameter (the only
// full tensor alive) and returns the rank's slice of it.
at::Tensor initial_shard(const ParameterPlan& p, uint64_t seed, int tp_rank, int tp_size);

}  // namespace crosstrain::models
