#include "peak_flops.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>

#include "crosstrain/comm/cost_model.h"
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

std::vector<int> turns_per_host(const std::vector<int64_t>& host_of_rank) {
  std::vector<int> turns(host_of_rank.size(), 0);
  for (size_t r = 0; r < host_of_rank.size(); ++r)
    for (size_t before = 0; before < r; ++before) turns[r] += host_of_rank[before] == host_of_rank[r] ? 1 : 0;
  return turns;
}

GemmPeak measure_in_turns_per_host(comm::Communicator& world, const std::function<GemmPeak()>& measure) {
  if (world.size() == 1) return measure();
  const at::Tensor mine = at::full({1}, static_cast<int64_t>(std::hash<std::string>{}(comm::local_hostname())), at::kLong);
  at::Tensor hosts = at::empty({world.size()}, at::kLong);
  world.all_gather(mine, hosts)->wait();
  const std::vector<int64_t> host_of_rank(hosts.data_ptr<int64_t>(), hosts.data_ptr<int64_t>() + world.size());
  const std::vector<int> turns = turns_per_host(host_of_rank);
  const int rounds = 1 + *std::max_element(turns.begin(), turns.end());
  GemmPeak peak;
  for (int round = 0; round < rounds; ++round) {
    if (turns[world.rank()] == round) peak = measure();
    world.barrier()->wait();  // the next ranks of each host start once these are done
  }
  return peak;
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
