// `crosstrain train` on the DLRM recipe as a user runs it: real processes over Gloo, real files. The recipe
// learns the synthetic task on 4 ranks (AUC well above chance), its checkpoint resumes on 2 ranks and exports
// as safetensors, and bad settings are refused with a message that names the key.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>

#include "crosstrain/checkpoint/safetensors.h"
#include "subprocess.h"

using namespace crosstrain::testing;
namespace fs = std::filesystem;

namespace {

const std::string kBin = CT_CROSSTRAIN_BIN;
const std::string kRecipe = CT_SOURCE_DIR "/recipes/dlrm-synthetic.toml";

std::string fresh(const std::string& name) {
  auto d = fs::path(::testing::TempDir()) / ("dlrm-cli-" + name);
  fs::remove_all(d);
  return d.string();
}

std::vector<std::string> train_args(const std::string& dir, int nproc, int steps) {
  return {kBin, "train", kRecipe, "--nproc", std::to_string(nproc), "--set", "run.dir=" + dir,
          "--set", "train.steps=" + std::to_string(steps), "--set", "train.eval_every=0", "--set", "run.log_every=10"};
}

double last_auc(const std::string& output) {
  std::smatch m;
  std::string::const_iterator from = output.begin();
  double auc = -1;
  const std::regex re("val auc ([0-9.]+)");
  while (std::regex_search(from, output.end(), m, re)) {
    auc = std::stod(m[1]);
    from = m.suffix().first;
  }
  return auc;
}

}  // namespace

TEST(DlrmCli, RecipeLearnsOnFourRanksResumesOnTwoAndExports) {
  const std::string dir = fresh("recipe");
  auto first = run_process(train_args(dir, 4, 60), {}, std::chrono::milliseconds(240000));
  ASSERT_EQ(first.exit_code(), 0) << first.output;
  EXPECT_TRUE(contains(first.output, "table 0: ")) << "the planner's placement of each table is shown";
  const double auc = last_auc(first.output);
  EXPECT_GT(auc, 0.65) << first.output;  // chance is 0.5; the planted signal allows about 0.8

  auto more = train_args(dir, 2, 70);
  more.push_back("--resume");
  auto second = run_process(more, {}, std::chrono::milliseconds(240000));
  ASSERT_EQ(second.exit_code(), 0) << second.output;
  EXPECT_TRUE(contains(second.output, "step 70/70")) << second.output;
  EXPECT_FALSE(contains(second.output, "step 10/70")) << "a resumed run continues after its checkpoint";

  const std::string file = dir + "/export.safetensors";
  auto exported = run_process({kBin, "ckpt", "export", dir, "--out", file});
  ASSERT_EQ(exported.exit_code(), 0) << exported.output;
  crosstrain::checkpoint::SafetensorsReader reader(file);
  EXPECT_EQ(reader.shape("embeddings.t0.weight"), (std::vector<int64_t>{400000, 16}));
  EXPECT_EQ(reader.shape("embeddings.t7.weight"), (std::vector<int64_t>{50, 16}));
  EXPECT_TRUE(reader.has("dense.top.0.weight"));
  auto hf = run_process({kBin, "ckpt", "export", "--format", "hf", dir, "--out", dir + "/hf"});
  EXPECT_NE(hf.exit_code(), 0);
  EXPECT_TRUE(contains(hf.output, "no Hugging Face layout")) << hf.output;
  fs::remove_all(dir);
}

TEST(DlrmCli, BadSettingsAreRefusedNamingTheKey) {
  const std::string dir = fresh("bad");
  struct Case {
    std::vector<std::string> sets;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {{"dlrm.tables=\"1000,ab\""}, "dlrm.tables"},
      {{"dlrm.sharding=\"diagonal\""}, "dlrm.sharding"},
      {{"sync.mode=ssp"}, "dlrm.mode = \"ps\""},
      {{"train.global_batch=1023"}, "train.global_batch"},
      {{"dlrm.mode=ps", "sync.mode=ssp", "dlrm.ps_storage=mmap", "dlrm.memory_budget_mb=1", "dlrm.cache_rows=100000"},
       "dlrm.cache_rows"},
      {{"dlrm.memory_budget_mb=1"}, "budget"},
  };
  for (const auto& c : cases) {
    auto args = train_args(dir, 2, 5);
    for (const auto& s : c.sets) args.insert(args.end(), {"--set", s});
    auto r = run_process(args);
    EXPECT_NE(r.exit_code(), 0) << c.expect;
    EXPECT_TRUE(contains(r.output, c.expect)) << c.expect << ":\n" << r.output;
    EXPECT_FALSE(fs::exists(dir + "/checkpoints")) << "a refused run writes nothing";
  }
  fs::remove_all(dir);
}
