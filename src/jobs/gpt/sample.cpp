#include "crosstrain/jobs/gpt/sample.h"

#include <torch/torch.h>

#include <algorithm>

#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/data/dataset.h"
#include "crosstrain/data/sft.h"
#include "crosstrain/data/tokenizer.h"
#include "crosstrain/models/gpt.h"
#include "crosstrain/models/gpt_parallel.h"

namespace crosstrain::train {
namespace {

// Prompt/response data: the model answers the first prompts of the validation part (or of the file when there
// is none), each answer cut at the end-of-text token, beside the expected response. After the end token the
// model has learned nothing (that target is masked), so one free-running sample would be noise.
std::string answer_prompts(models::GPT& model, const Config& config, const data::Tokenizer* tokenizer) {
  const auto decode = [&](const std::vector<int64_t>& ids) {
    return tokenizer ? tokenizer->decode(ids) : data::ByteTokenizer().decode(ids);
  };
  const auto encode = [&](const std::string& text) {
    if (tokenizer) return tokenizer->encode(text);
    const auto bytes = data::ByteTokenizer().encode(text);
    return std::vector<uint32_t>(bytes.begin(), bytes.end());
  };
  const int64_t eos = data::eos_token(config.data);
  const data::PackedExamples p = data::pack_jsonl(config.data.path, encode, static_cast<uint32_t>(eos));
  const size_t n = p.starts.size();
  const auto val = static_cast<size_t>(static_cast<double>(n) * config.data.val_fraction);
  const int64_t room = config.model.block_size;
  std::string text;
  for (size_t i = val > 0 ? n - val : 0, shown = 0; i < n && shown < 8; ++i, ++shown) {
    const size_t end = i + 1 < n ? p.starts[i + 1] : p.tokens.size();
    size_t cut = p.starts[i];
    while (cut < end && !(p.flags[cut] & data::LossMask::kTrained)) ++cut;  // the prompt's end
    std::vector<int64_t> prompt(p.tokens.begin() + static_cast<std::ptrdiff_t>(p.starts[i]),
                                p.tokens.begin() + static_cast<std::ptrdiff_t>(cut));
    const auto new_tokens = std::min<int64_t>(config.train.sample_tokens, room - static_cast<int64_t>(prompt.size()));
    if (prompt.empty() || new_tokens <= 0) continue;
    auto out = model->generate(torch::tensor(prompt, torch::kLong).view({1, -1}), new_tokens, 0.8, 40,
                               config.run.seed + i);
    std::vector<int64_t> answer;
    for (int64_t k = static_cast<int64_t>(prompt.size()); k < out.size(1) && out[0][k].item<int64_t>() != eos; ++k)
      answer.push_back(out[0][k].item<int64_t>());
    std::vector<int64_t> expected(p.tokens.begin() + static_cast<std::ptrdiff_t>(cut),
                                  p.tokens.begin() + static_cast<std::ptrdiff_t>(end) - 1);
    text += decode(prompt) + decode(answer) + "    (expected: " + decode(expected) + ")\n";
  }
  return text;
}

}  // namespace

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
  if (data::is_jsonl(config.data)) return answer_prompts(model, config, tokenizer.get());
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
