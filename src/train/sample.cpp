#include "crosstrain/train/sample.h"

#include <torch/torch.h>

#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/data/dataset.h"
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
  // A token file's own tokenizer (meta.json) starts and reads the sample; text data is bytes.
  const auto tokenizer = data::data_tokenizer(config.data);
  std::vector<int64_t> start{'\n'};
  if (tokenizer) {
    const auto newline = tokenizer->encode("\n");
    start.assign(newline.begin(), newline.end());
  }
  auto prompt = torch::tensor(start, torch::kLong).view({1, -1});
  auto out = model->generate(prompt, config.train.sample_tokens, 0.8, 40, config.run.seed);
  std::vector<int64_t> ids(out.data_ptr<int64_t>() + prompt.numel(), out.data_ptr<int64_t>() + out.numel());
  return tokenizer ? tokenizer->decode(ids) : data::ByteTokenizer().decode(ids);
}

}  // namespace crosstrain::train
