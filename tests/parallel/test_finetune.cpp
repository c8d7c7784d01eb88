// Fine-tuning: frozen parameters stay as they started and get no optimizer state; LoRA adapters start as the
// base model (B = 0), train in every layout like the single process, and a fine-tuning run resumes exactly.
// Ranks are threads (in-process back end); files are real.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <mutex>

#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/core/error.h"
#include "crosstrain/models/gpt.h"
#include "crosstrain/models/gpt_init.h"
#include "crosstrain/interop/hf/checkpoint.h"
#include "crosstrain/train/test_hooks.h"
#include "crosstrain/jobs/trainer.h"
#include "train_fixture.h"

using namespace crosstrain;
namespace fs = std::filesystem;

namespace {

struct Layout {
  int dp = 1, pp = 1, tp = 1, zero = 0;
  bool sequence_parallel = false;
  std::string schedule = "1f1b";
};

train::Config finetune_config(const std::string& tag, const std::string& arch) {
  auto c = crosstrain::testing::tiny_config(tag);
  c.model.arch = models::parse_model_arch(arch);
  c.model.n_layer = 4;
  c.model.n_head = 4;
  c.model.n_embd = 32;
  c.model.block_size = 16;
  if (arch == "llama") c.model.n_kv_head = 2;
  c.train.steps = 8;
  c.train.lr = 1e-2;
  return c;
}

struct Result {
  std::vector<double> losses;
  std::vector<std::map<std::string, at::Tensor>> params;  // each rank's shards after the run
};

Result train(train::Config c, const Layout& l, bool resume = false) {
  c.parallel.dp = l.dp;
  c.parallel.pp = l.pp;
  c.parallel.tp = l.tp;
  c.parallel.zero = l.zero;
  c.parallel.sequence_parallel = l.sequence_parallel;
  c.parallel.schedule = l.schedule;
  if (!resume) fs::remove_all(c.run.dir);  // each run starts fresh in its directory
  Result r;
  const int world = l.dp * l.pp * l.tp;
  r.params.resize(world);
  std::mutex m;
  comm::FakeWorld::run(world, [&](comm::Communicator& comm) {
    train::Trainer trainer(c, comm);
    train::TrainOptions o;
    o.quiet = true;
    o.resume = resume;
    train::ParameterDump dump;
    o.dump = &dump;
    auto run = trainer.run(o);
    std::lock_guard<std::mutex> lock(m);
    r.params[comm.rank()] = dump.shards;
    if (comm.rank() == 0)
      for (const auto& s : run.steps) r.losses.push_back(s.loss);
  }, comm::Millis(120000));
  return r;
}

// The seeded initial value of a parameter (what a frozen one must still hold).
at::Tensor initial(const train::Config& c, const std::string& name) {
  return models::initial_shard(models::ParallelPlan(c.model).at(name), c.run.seed, 0, 1);
}

TEST(FineTune, FrozenPartsKeepTheirValuesAndTheRestTrains) {
  auto c = finetune_config("freeze", "gpt");
  c.train.freeze = "embedding,0-1";
  auto r = train(c, {});
  const auto& p = r.params[0];
  for (const auto* name : {"wte.weight", "wpe.weight", "h.0.attn.c_attn.weight", "h.1.mlp.c_fc.bias"})
    EXPECT_TRUE(torch::equal(p.at(name), initial(c, name))) << name << " must not move";
  for (const auto* name : {"h.2.attn.c_attn.weight", "h.3.mlp.c_fc.weight", "lm_head.weight"})
    EXPECT_FALSE(torch::equal(p.at(name), initial(c, name))) << name << " must train";
  EXPECT_LT(r.losses.back(), r.losses.front());
}

TEST(FineTune, LoraStartsAsTheBaseModelAndTrainsOnlyTheAdapters) {
  for (const std::string arch : {"gpt", "llama"}) {
    auto base = finetune_config("lora_base_" + arch, arch);
    auto c = finetune_config("lora_" + arch, arch);
    c.model.lora_rank = 4;
    c.model.lora_alpha = 8;
    base.train.steps = c.train.steps = 30;
    base.train.lr = c.train.lr = 3e-2;
    auto plain = train(base, {}), lora = train(c, {});
    // B = 0: the first forward pass is the base model's.
    EXPECT_NEAR(lora.losses[0], plain.losses[0], 1e-6 * plain.losses[0]) << arch;
    double late = 0;
    for (size_t i = 25; i < 30; ++i) late += lora.losses[i] / 5;
    EXPECT_LT(late, lora.losses.front() - 0.1) << arch << ": the adapters must learn";
    const auto& p = lora.params[0];
    const std::string q = arch == "gpt" ? "h.1.attn.c_attn" : "h.1.attn.q_proj";
    EXPECT_TRUE(torch::equal(p.at(q + ".weight"), initial(c, q + ".weight"))) << arch;
    EXPECT_TRUE(torch::equal(p.at("wte.weight"), initial(c, "wte.weight"))) << arch;
    EXPECT_GT(p.at(q + ".lora_B").abs().max().item<double>(), 0.0) << arch;
    EXPECT_FALSE(torch::equal(p.at(q + ".lora_A"), initial(c, q + ".lora_A"))) << arch;
  }
}

// LoRA in parallel layouts gives the single process's losses and adapters.
TEST(FineTune, LoraLayoutsMatchTheSingleProcess) {
  for (const std::string arch : {"gpt", "llama"}) {
    auto c = finetune_config("lora_layouts_" + arch, arch);
    c.model.lora_rank = 4;
    auto one = train(c, {});
    for (const Layout& l : {Layout{2, 1, 1, 0}, Layout{1, 1, 2, 0, true}, Layout{1, 2, 1, 0, false, "zb-h1"},
                            Layout{2, 1, 1, 3}}) {
      const std::string what = arch + " dp" + std::to_string(l.dp) + " pp" + std::to_string(l.pp) + " tp" +
                               std::to_string(l.tp) + " zero" + std::to_string(l.zero);
      auto r = train(c, l);
      ASSERT_EQ(r.losses.size(), one.losses.size()) << what;
      for (size_t i = 0; i < r.losses.size(); ++i)
        EXPECT_NEAR(r.losses[i], one.losses[i], 1e-4 * one.losses[i]) << what << " step " << i + 1;
      if (l.tp == 1 && l.pp == 1) {  // whole tensors on rank 0: the adapters themselves
        for (const auto& [name, t] : one.params[0])
          if (name.find("lora") != std::string::npos)
            EXPECT_LT((r.params[0].at(name) - t).abs().max().item<double>(), 1e-4) << what << " " << name;
      }
    }
  }
}

// A LoRA fine-tune of a pre-trained checkpoint (model.init_from) stopped at step 4 and resumed in another layout
// continues with the uninterrupted run's losses: the checkpoint holds the adapters, the frozen base comes from
// init_from again.
TEST(FineTune, ResumesExactly) {
  const std::string base = (fs::path(::testing::TempDir()) / "finetune_resume").string();
  fs::remove_all(base);
  auto pre = finetune_config("finetune_pretrain", "llama");
  pre.train.steps = 3;
  pre.run.dir = base + "/pretrained";
  train(pre, {});
  auto c = finetune_config("finetune_resume", "llama");
  c.model_init_from = base + "/pretrained";
  c.run.seed = 99;  // the base must come from init_from, not from the seed
  c.train.lr = 3e-3;
  c.model.lora_rank = 4;
  c.train.freeze = "";  // LoRA: everything else frozen
  c.train.checkpoint_every = 4;
  c.train.keep_checkpoints = 0;
  c.run.dir = base + "/full";
  auto full = train(c, {2, 1, 1, 0});
  ASSERT_EQ(full.losses.size(), 8u);
  fs::create_directories(base + "/part/checkpoints");
  fs::copy(base + "/full/checkpoints/step_00000004", base + "/part/checkpoints/step_00000004",
           fs::copy_options::recursive);
  c.run.dir = base + "/part";
  auto resumed = train(c, {1, 1, 2, 0}, /*resume=*/true);
  ASSERT_EQ(resumed.losses.size(), 4u);
  for (size_t i = 0; i < 4; ++i)
    EXPECT_NEAR(resumed.losses[i], full.losses[4 + i], 1e-5 * full.losses[4 + i]) << "step " << 5 + i;
  // And it did start from the pre-trained weights: a fresh model of this seed starts elsewhere.
  auto fresh = c;
  fresh.model_init_from = "";
  fresh.run.dir = base + "/fresh";
  fresh.train.steps = 1;
  EXPECT_GT(std::abs(train(fresh, {}).losses[0] - full.losses[0]), 1e-3);
}

// A fine-tune's checkpoint holds what it trained; read as weights (ckpt export, init_from) it is the whole
// fine-tuned model: frozen weights from init_from (or the seed), LoRA adapters merged (W + s B A).
TEST(FineTune, CheckpointsReadAsTheWholeFineTunedModel) {
  const std::string base = (fs::path(::testing::TempDir()) / "finetune_export").string();
  fs::remove_all(base);
  auto lora = finetune_config("finetune_export_lora", "gpt");
  lora.model.lora_rank = 4;
  lora.model.lora_alpha = 8;
  lora.train.checkpoint_every = lora.train.steps;
  lora.run.dir = base + "/lora";
  const auto trained = train(lora, {}).params[0];
  auto source = train::open_weights(lora.run.dir);
  EXPECT_EQ(source->config().lora_rank, 0);
  const std::string q = "h.1.attn.c_attn";
  auto merged = trained.at(q + ".weight") + 2.0 * trained.at(q + ".lora_B").mm(trained.at(q + ".lora_A"));
  EXPECT_LT((source->read(q + ".weight") - merged).abs().max().item<double>(), 1e-6);
  EXPECT_FALSE(torch::equal(merged, trained.at(q + ".weight"))) << "the adapters must have moved";
  EXPECT_TRUE(torch::equal(source->read("wte.weight"), initial(lora, "wte.weight"))) << "frozen, from the seed";

  auto pre = finetune_config("finetune_export_pre", "gpt");
  pre.train.steps = 2;
  pre.run.dir = base + "/pre";
  train(pre, {});
  auto frozen = finetune_config("finetune_export_frozen", "gpt");
  frozen.model_init_from = pre.run.dir;
  frozen.train.freeze = "embedding";
  frozen.train.checkpoint_every = frozen.train.steps;
  frozen.run.dir = base + "/frozen";
  const auto tuned = train(frozen, {}).params[0];
  auto from_frozen = train::open_weights(frozen.run.dir), from_pre = train::open_weights(pre.run.dir);
  from_frozen->check();
  EXPECT_TRUE(torch::equal(from_frozen->read("wte.weight"), from_pre->read("wte.weight")));
  EXPECT_TRUE(torch::equal(from_frozen->read("h.2.mlp.c_fc.weight"), tuned.at("h.2.mlp.c_fc.weight")));

  // Only what the run froze may be missing: the same checkpoint claiming no freeze is refused, naming the tensor.
  const std::string damaged = base + "/claims_no_freeze";
  fs::copy(frozen.run.dir + "/checkpoints/step_00000008", damaged, fs::copy_options::recursive);
  std::ifstream in(damaged + "/manifest.json");
  std::string manifest((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string spec = "freeze = 'embedding'";  // the run's config, as the manifest records it
  ASSERT_NE(manifest.find(spec), std::string::npos);
  manifest.replace(manifest.find(spec), spec.size(), "freeze = ''");
  std::ofstream(damaged + "/manifest.json") << manifest;
  try {
    train::open_weights(damaged)->check();
    FAIL() << "a checkpoint without wte.weight that froze nothing must be refused";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("wte.weight"), std::string::npos) << e.what();
  }
}

TEST(FineTune, AStageWithNothingToTrainIsAClearError) {
  auto c = finetune_config("freeze_stage", "gpt");
  c.train.freeze = "embedding,0-1";  // pipeline stage 0 of 2 holds exactly these
  try {
    train(c, {1, 2, 1});
    FAIL() << "expected an error";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("freezes every parameter of pipeline stage 0"), std::string::npos) << e.what();
  }
}

TEST(FineTune, FreezeSpecIsCheckedAndNamesWhatItFreezes) {
  models::GPTConfig m;
  m.n_layer = 4;
  const models::ParallelPlan plan(m);
  auto frozen = models::frozen_parameters(plan, m, "embedding, 2-3");
  EXPECT_TRUE(frozen.count("wte.weight") && frozen.count("wpe.weight") && frozen.count("h.2.ln_1.weight") &&
              frozen.count("h.3.mlp.c_proj.bias"));
  EXPECT_FALSE(frozen.count("h.1.attn.c_attn.weight") || frozen.count("lm_head.weight"));
  EXPECT_TRUE(models::frozen_parameters(plan, m, "").empty());
  auto message = [&](const std::string& spec) {
    try {
      models::frozen_parameters(plan, m, spec);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("0-7").find("outside the model's 0-3"), std::string::npos) << message("0-7");
  EXPECT_NE(message("layers").find("'layers' is not"), std::string::npos);
  EXPECT_NE(message("all").find("leaves nothing to train"), std::string::npos);
  m.lora_rank = 2;
  const models::ParallelPlan with_lora(m);
  auto lora_frozen = models::frozen_parameters(with_lora, m, "");
  EXPECT_EQ(lora_frozen.size(), with_lora.parameters().size() - 2 * 4u);  // all but A and B of each block
  EXPECT_FALSE(lora_frozen.count("h.0.attn.c_attn.lora_A"));
}

}  // namespace
