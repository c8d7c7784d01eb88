// Every parallel layout against the single-process reference through the trainer: same seed, same global
// batch, 10 steps; per-step losses within 1e-4 (relative) and, at the last step, every rank's gradient shards
// within 1e-4 of the matching slices of the reference gradients. Ranks are threads (in-process back end).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <mutex>

#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/data/dataset.h"
#include "crosstrain/data/sampler.h"
#include "crosstrain/models/gpt_parallel.h"
#include "crosstrain/train/lr_schedule.h"
#include "crosstrain/train/test_hooks.h"
#include "crosstrain/jobs/trainer.h"
#include "train_fixture.h"

using namespace crosstrain;

namespace {

struct Layout {
  int dp, pp, tp;
  std::string schedule = "1f1b";
  bool sequence_parallel = false;
  int64_t microbatches = 0;  // train.micro_batches; 0: the default (a pipeline raises it to pp)
  std::string stage_layers = "";
  int zero = 0;
};

// arch "llama": the same shape with grouped-query attention (2 key/value heads for 4 query heads), RMSNorm,
// rotary positions and a SwiGLU MLP (width 96); "llama-tied": with the head tied to the embedding.
train::Config config_for(const std::string& tag, const std::string& arch = "gpt") {
  auto c = crosstrain::testing::tiny_config(tag);
  c.model.n_layer = 8;
  c.model.n_head = 4;
  c.model.n_embd = 32;
  c.model.block_size = 16;
  c.model.arch = arch == "gpt" ? models::ModelArch::Gpt : models::ModelArch::Llama;
  if (c.model.is_llama()) c.model.n_kv_head = 2;
  c.model.tie_embeddings = arch == "llama-tied";
  c.train.steps = 10;
  c.train.global_batch = 8;
  return c;
}

using TensorsByName = std::map<std::string, at::Tensor>;

// Each rank's gradients at the last step or, under ZeRO (whose gradients live in slices), its final parameters.
std::vector<TensorsByName> run_layout(const Layout& l, const std::string& tag, const std::string& arch,
                                      std::vector<double>& losses) {
  auto c = config_for(tag, arch);
  c.parallel.zero = l.zero;
  c.parallel.dp = l.dp;
  c.parallel.pp = l.pp;
  c.parallel.tp = l.tp;
  c.parallel.schedule = l.schedule;
  c.parallel.sequence_parallel = l.sequence_parallel;
  if (l.microbatches > 0) c.train.micro_batches = l.microbatches;
  c.parallel.stage_layers = l.stage_layers;
  const int world = l.dp * l.pp * l.tp;
  std::vector<std::map<std::string, at::Tensor>> grads(world);
  std::mutex m;
  comm::FakeWorld::run(world, [&](comm::Communicator& comm) {
    train::Trainer trainer(c, comm);
    train::TrainOptions o;
    o.quiet = true;
    train::ParameterDump dump;
    o.dump = &dump;
    auto r = trainer.run(o);
    std::lock_guard<std::mutex> lock(m);
    grads[comm.rank()] = l.zero > 0 ? std::move(dump.shards) : std::move(dump.gradients);
    if (comm.rank() == 0)
      for (const auto& s : r.steps) losses.push_back(s.loss);
  }, comm::Millis(120000));
  return grads;
}

// The reference, written independently of the trainer: the single-device GPT, one process, a plain loop with
// libtorch's AdamW and clip_grad_norm_ over the same global batches.
// Returns the gradients at the last step; `params` gets the parameters after it.
TensorsByName reference_run(const std::string& arch, std::vector<double>& losses, TensorsByName& params) {
  auto c = config_for("reference_" + arch, arch);
  models::GPT model(c.model, c.run.seed);
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : model->parameters()) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  auto options = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(c.train.lr).betas({c.train.beta1, c.train.beta2}).eps(c.train.eps).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, options(c.train.weight_decay));
  groups.emplace_back(no_decay, options(0.0));
  torch::optim::AdamW adamw(groups, torch::optim::AdamWOptions(c.train.lr));
  auto splits = data::load_dataset(c.data, c.model.block_size);
  data::DistributedSampler sampler(c.run.seed, static_cast<int64_t>(splits.train.size()), c.model.block_size,
                                   c.train.global_batch, 0, 1, 1);
  std::map<std::string, at::Tensor> grads;
  for (int64_t step = 1; step <= c.train.steps; ++step) {
    const double lr = train::learning_rate(step, c.train.warmup_steps, c.train.steps, c.train.lr, c.train.min_lr);
    for (auto& g : adamw.param_groups()) static_cast<torch::optim::AdamWOptions&>(g.options()).lr(lr);
    torch::Tensor x, y;
    data::make_batch(splits.train, sampler.local_offsets(step, 0), c.model.block_size, x, y);
    adamw.zero_grad();
    auto loss = model->loss(x, y);
    loss.backward();
    losses.push_back(loss.item<double>());
    torch::nn::utils::clip_grad_norm_(model->parameters(), c.train.grad_clip);
    if (step == c.train.steps)
      for (const auto& p : model->named_parameters()) grads[p.key()] = p.value().grad().clone();
    adamw.step();
  }
  for (const auto& p : model->named_parameters()) params[p.key()] = p.value().detach().clone();
  return grads;
}

void check_layout(const Layout& l, const std::string& tag, const std::string& arch = "gpt") {
  static std::map<std::string, std::vector<double>> ref_losses_of;
  static std::map<std::string, TensorsByName> ref_grads_of, ref_params_of;
  auto& ref_losses = ref_losses_of[arch];
  if (ref_losses.empty()) ref_grads_of[arch] = reference_run(arch, ref_losses, ref_params_of[arch]);
  // Under ZeRO the runs report final parameters, compared with the reference's.
  const TensorsByName& ref_grads = l.zero > 0 ? ref_params_of[arch] : ref_grads_of[arch];
  std::vector<double> losses;
  auto grads = run_layout(l, tag, arch, losses);
  ASSERT_EQ(losses.size(), ref_losses.size());
  for (size_t i = 0; i < losses.size(); ++i)
    EXPECT_NEAR(losses[i], ref_losses[i], 1e-4 * std::abs(ref_losses[i])) << tag << " step " << i + 1;
  EXPECT_LT(losses.back(), losses.front()) << tag << ": the loss should fall";
  auto c = config_for(tag, arch);
  size_t covered = 0;
  for (size_t rank = 0; rank < grads.size(); ++rank) {
    const int tp_index = static_cast<int>(rank) % l.tp;
    for (const auto& [name, g] : grads[rank]) {
      auto want = models::shard_of(name, ref_grads.at(name), c.model, tp_index, l.tp);
      ASSERT_EQ(g.sizes(), want.sizes()) << tag << " " << name;
      const double scale = std::max(1.0, want.abs().max().item<double>());
      EXPECT_LE((g - want).abs().max().item<double>(), 1e-4 * scale) << tag << " rank " << rank << " " << name;
      ++covered;
    }
  }
  // Every parameter shard of the model appears on some rank.
  EXPECT_GE(covered, ref_grads.size() * static_cast<size_t>(l.tp)) << tag;
}

// The UsageError a trainer of config `c` on `world` ranks stops with, or "no error".
std::string message(const train::Config& c, int world) {
  try {
    comm::FakeWorld w(world);
    auto comm = w.communicator(0);
    train::Trainer t(c, *comm);
  } catch (const UsageError& e) {
    return std::string(e.what());
  }
  return std::string("no error");
}

}  // namespace

TEST(Layouts, SingleProcessTrainerMatchesReference) { check_layout({1, 1, 1}, "trainer_1"); }
TEST(Layouts, DataParallel2) { check_layout({2, 1, 1}, "dp2"); }
TEST(Layouts, TensorParallel2) { check_layout({1, 1, 2}, "tp2"); }
TEST(Layouts, TensorParallel2SequenceParallel) { check_layout({1, 1, 2, "1f1b", true}, "tp2_sp"); }
TEST(Layouts, Pipeline2GPipe) { check_layout({1, 2, 1, "gpipe"}, "pp2_gpipe"); }
TEST(Layouts, Pipeline2OneFOneB) { check_layout({1, 2, 1, "1f1b", false, 4}, "pp2_1f1b"); }
TEST(Layouts, Pipeline2Interleaved) { check_layout({1, 2, 1, "interleaved", false, 4}, "pp2_interleaved"); }
TEST(Layouts, Pipeline2ZeroBubble) { check_layout({1, 2, 1, "zb-h1", false, 4}, "pp2_zbh1"); }
// Zero-bubble with the weight-gradient store through tensor-parallel linears (+SP) and with data-parallel
// reduction hooks fired by the deferred weight gradients.
TEST(Layouts, Pipeline2Tensor2ZeroBubble) { check_layout({1, 2, 2, "zb-h1", true, 4}, "pp2_tp2_sp_zbh1"); }
TEST(Layouts, Pipeline2ZeroBubbleH2) { check_layout({1, 2, 1, "zb-h2", false, 4}, "pp2_zbh2"); }
TEST(Layouts, Data2Pipeline2ZeroBubble) { check_layout({2, 2, 1, "zb-h1", false, 4}, "dp2_pp2_zbh1"); }
TEST(Layouts, Pipeline4Interleaved) { check_layout({1, 4, 1, "interleaved", false, 4}, "pp4_interleaved"); }
TEST(Layouts, Pipeline2ExplicitUnevenStages) { check_layout({1, 2, 1, "1f1b", false, 2, "6,2"}, "pp2_explicit"); }
TEST(Layouts, Data2Tensor2) { check_layout({2, 1, 2}, "dp2_tp2"); }
TEST(Layouts, Data2Pipeline2) { check_layout({2, 2, 1}, "dp2_pp2"); }
TEST(Layouts, Pipeline2Tensor2) { check_layout({1, 2, 2, "1f1b", true}, "pp2_tp2_sp"); }
TEST(Layouts, Data2Pipeline2Tensor2) { check_layout({2, 2, 2}, "dp2_pp2_tp2"); }

// The Llama family through the same parallel plan machinery, against its own single-device reference.
TEST(LlamaLayouts, SingleProcessTrainerMatchesReference) { check_layout({1, 1, 1}, "llama_1", "llama"); }
TEST(LlamaLayouts, DataParallel2) { check_layout({2, 1, 1}, "llama_dp2", "llama"); }
TEST(LlamaLayouts, TensorParallel2SequenceParallel) { check_layout({1, 1, 2, "1f1b", true}, "llama_tp2_sp", "llama"); }
TEST(LlamaLayouts, Pipeline2OneFOneB) { check_layout({1, 2, 1, "1f1b", false, 4}, "llama_pp2_1f1b", "llama"); }
TEST(LlamaLayouts, Pipeline2ZeroBubble) { check_layout({1, 2, 1, "zb-h1", false, 4}, "llama_pp2_zbh1", "llama"); }
TEST(LlamaLayouts, Pipeline2Interleaved) {
  check_layout({1, 2, 1, "interleaved", false, 4}, "llama_pp2_interleaved", "llama");
}
TEST(LlamaLayouts, Data2Zero3) { check_layout({2, 1, 1, "1f1b", false, 0, "", 3}, "llama_dp2_zero3", "llama"); }
TEST(LlamaLayouts, TiedEmbeddingsTensor2) { check_layout({1, 1, 2}, "llama_tied_tp2", "llama-tied"); }
TEST(LlamaLayouts, TiedEmbeddingsData2Zero2) {
  check_layout({2, 1, 1, "1f1b", false, 0, "", 2}, "llama_tied_dp2_zero2", "llama-tied");
}
TEST(LlamaLayouts, Pipeline2Tensor2) { check_layout({1, 2, 2, "1f1b", true}, "llama_pp2_tp2_sp", "llama"); }
TEST(LlamaLayouts, Pipeline2Tensor2ZeroBubble) {
  check_layout({1, 2, 2, "zb-h1", true, 4}, "llama_pp2_tp2_sp_zbh1", "llama");
}

TEST(LlamaLayouts, BadShapesAreClearErrors) {
  auto c = config_for("llama_bad", "llama");
  c.parallel.tp = 4;  // 2 key/value heads over 4 ranks
  EXPECT_NE(message(c, 4).find("n_kv_head = 2 is not divisible by parallel.tp = 4"), std::string::npos)
      << message(c, 4);
  c = config_for("llama_bad", "llama");
  c.model.n_kv_head = 3;
  EXPECT_NE(message(c, 1).find("n_kv_head (3) must divide n_head (4)"), std::string::npos) << message(c, 1);
  c = config_for("llama_bad", "llama");
  c.model.tie_embeddings = true;
  c.parallel.pp = 2;
  EXPECT_NE(message(c, 2).find("tie_embeddings needs one pipeline stage"), std::string::npos) << message(c, 2);
  c = config_for("llama_bad", "llama");
  std::string refused;  // refused when the config is read, before any check runs
  try {
    train::apply_override(c, "model.arch=mamba");
  } catch (const UsageError& e) {
    refused = e.what();
  }
  EXPECT_NE(refused.find("model.arch = 'mamba' is not a model family crosstrain trains; choose one of gpt, llama, dlrm"),
            std::string::npos)
      << refused;
}

TEST(Layouts, BadLayoutsAreClearErrors) {
  auto c = config_for("bad");
  c.parallel.pp = 2;
  c.parallel.tp = 2;
  c.parallel.dp = 2;
  EXPECT_NE(message(c, 4).find("dp=2 x pp=2 x tp=2 = 8"), std::string::npos);
  c = config_for("bad");
  c.parallel.pp = 9;
  EXPECT_NE(message(c, 9).find("only 8 layers"), std::string::npos) << message(c, 9);
  c = config_for("bad");
  c.parallel.tp = 3;
  EXPECT_NE(message(c, 3).find("n_head = 4 is not divisible by parallel.tp = 3"), std::string::npos);
  c = config_for("bad");
  c.parallel.sequence_parallel = true;
  EXPECT_NE(message(c, 1).find("needs parallel.tp > 1"), std::string::npos);
  c = config_for("bad");
  c.parallel.pp = 2;
  c.parallel.stage_layers = "4,3";
  EXPECT_NE(message(c, 2).find("adding up to model.n_layer = 8"), std::string::npos) << message(c, 2);
  c = config_for("bad");
  c.parallel.schedule = "zigzag";
  EXPECT_NE(message(c, 1).find("zigzag"), std::string::npos);
}
