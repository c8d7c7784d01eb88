#include "crosstrain/train/sample.h"

#include <torch/torch.h>

#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/data/tokenizer.h"
#include "crosstrain/models/gpt.h"
#include "crosstrain/models/gpt_parallel.h"

namespace crosstrain::train {

std::string sample_text(const Config& config, const std::string& checkpoint_dir) {
  models::GPT model(config.model, config.run.seed);
  checkpoint::CheckpointReader reader(checkpoint_dir);
  // How the model splits a tensor, so the reader can put tensor-parallel shards back together.
  const models::ParallelPlan plan(config.model);
  const checkpoint::SplitFn split = [&](const std::string& name, const at::Tensor& full, int rank, int size) {
    return models::shard_of(plan, name, full, rank, size);
  };
  {
    torch::NoGradGuard no_grad;
    for (auto& item : model->named_parameters())
      item.value().copy_(reader.read_full(item.key(), split).view(item.value().sizes()));
  }
  model->eval();
  auto prompt = torch::full({1, 1}, static_cast<int64_t>('\n'), torch::kLong);
  auto out = model->generate(prompt, config.train.sample_tokens, 0.8, 40, config.run.seed);
  std::vector<int64_t> ids(out.data_ptr<int64_t>() + 1, out.data_ptr<int64_t>() + out.numel());
  return data::ByteTokenizer().decode(ids);
}

}  // namespace crosstrain::train
