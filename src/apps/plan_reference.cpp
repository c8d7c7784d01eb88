#include "plan_reference.h"

#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "crosstrain/models/gpt.h"

namespace crosstrain::apps {

double reference_step_seconds(const models::GPTConfig& config, int64_t micro_batch, const std::string& dtype,
                              double seconds) {
  models::GPT model(config, /*seed=*/1);
  if (dtype == "bf16") model->to(torch::kBFloat16);
  torch::manual_seed(0);
  const torch::Tensor tokens = torch::randint(config.vocab_size, {micro_batch, config.block_size}, torch::kLong);
  const torch::Tensor targets = torch::randint(config.vocab_size, {micro_batch, config.block_size}, torch::kLong);
  auto step = [&] {
    model->zero_grad();
    const torch::Tensor logits = model->forward(tokens).to(torch::kFloat);
    torch::nn::functional::cross_entropy(logits.view({-1, config.vocab_size}), targets.view({-1})).backward();
  };
  for (int i = 0; i < 3; ++i) step();  // warm-up: allocator, first-touch, BLAS buffers
  std::vector<double> times;
  const auto start = std::chrono::steady_clock::now();
  while (times.size() < 5 ||
         (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds && times.size() < 200)) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

}  // namespace crosstrain::apps
