// --resume into another model is refused (issue 40): a checkpoint of a 4-layer GPT does not resume as 2 layers
// (blocks dropped, then the smaller model saved over the experiment), nor with other heads (same shapes, other
// meaning) or another family. The error names each field with both values, nothing in the run folder changes,
// and the check holds both before any rank starts and inside the ranks (under a launcher). Where a manifest
// records no config, the tensors themselves are compared, in both directions.
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <regex>

#include "cli_fixture.h"
#include "crosstrain/core/error.h"
#include "crosstrain/train/resume_check.h"

using namespace crosstrain::testing;
namespace fs = std::filesystem;
using std::chrono::milliseconds;

namespace {

// Every file and folder under `dir` with its size and modification time.
std::map<std::string, std::string> listing(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const auto when = e.last_write_time().time_since_epoch().count();
    out[fs::relative(e.path(), dir).string()] =
        (e.is_regular_file() ? std::to_string(e.file_size()) : "dir") + " @" + std::to_string(when);
  }
  return out;
}

// The 4-layer tiny model trained for 2 steps, once for every test here (its run folder is copied, not changed).
const std::string& trained_run() {
  static const std::string dir = [] {
    // One per process: ctest runs each test as its own process, two at a time.
    const std::string d = fresh_dir("resume_model_base_" + std::to_string(getpid()));
    auto r = run_process(with(tiny_args(d, 1, 2), {"--set", "model.n_layer=4"}), {}, milliseconds(120000));
    EXPECT_EQ(r.exit_code(), 0) << r.output;
    return d;
  }();
  return dir;
}

std::string copy_of_trained_run(const std::string& name) {
  const std::string dir = fresh_dir(name);
  fs::copy(trained_run(), dir, fs::copy_options::recursive);
  return dir;
}

// Runs `argv` and expects a refusal that says `expect` and leaves `dir` as it was.
void expect_refused(const std::string& dir, const std::vector<std::string>& argv, const std::string& expect) {
  const auto before = listing(dir);
  auto r = run_process(argv, {}, milliseconds(60000));
  EXPECT_NE(r.exit_code(), 0) << r.output;
  EXPECT_FALSE(r.timed_out);
  EXPECT_TRUE(contains(r.output, expect)) << "expected '" << expect << "' in:\n" << r.output;
  EXPECT_TRUE(contains(r.output, "Nothing was changed")) << r.output;
  EXPECT_TRUE(contains(r.output, "--set model.init_from=" + dir + "/checkpoints/step_00000002")) << r.output;
  EXPECT_FALSE(contains(r.output, "resumed from")) << r.output;
  EXPECT_EQ(listing(dir), before) << "the run folder changed";
}

}  // namespace

TEST(ResumeModel, AnotherModelIsRefusedNamingTheFieldAndNothingChanges) {
  const std::string dir = copy_of_trained_run("resume_model_cli");
  const auto base = with(tiny_args(dir, 1, 4), {"--set", "model.n_layer=4"});
  // tiny_args has 2 layers: the recipe as it was before the 4-layer --set.
  expect_refused(dir, with(tiny_args(dir, 1, 4), {"--resume"}), "model.n_layer: 4 -> 2");
  expect_refused(dir, with(base, {"--set", "model.n_head=4", "--resume"}), "model.n_head: 2 -> 4");
  expect_refused(dir, with(base, {"--set", "model.arch=llama", "--resume"}), "model.arch: \"gpt\" -> \"llama\"");
  // Several at once: each is named.
  expect_refused(dir, with(tiny_args(dir, 1, 4), {"--set", "model.n_embd=64", "--resume"}),
                 "model.n_layer: 4 -> 2; model.n_embd: 32 -> 64");
  // The same model resumes (dropout changes no tensor).
  auto ok = run_process(with(base, {"--set", "model.dropout=0.1", "--resume"}), {}, milliseconds(60000));
  ASSERT_EQ(ok.exit_code(), 0) << ok.output;
  EXPECT_TRUE(contains(ok.output, "resumed from")) << ok.output;
}

TEST(ResumeModel, TheRanksRefuseItToo) {
  // Under a launcher the ranks start without the launching process's check: Run::resume checks as well.
  const std::string dir = copy_of_trained_run("resume_model_ranks");
  expect_refused(dir, with({kBin, "run", "--nproc", "1", "--"}, with(tiny_args(dir, 1, 4), {"--resume"})),
                 "model.n_layer: 4 -> 2");
}

TEST(ResumeModel, WithoutASavedConfigTheTensorsAreCompared) {
  const std::string dir = copy_of_trained_run("resume_model_tensors");
  const fs::path manifest = fs::path(dir) / "checkpoints" / "step_00000002" / "manifest.json";
  nlohmann::json m;
  {
    std::ifstream in(manifest);
    m = nlohmann::json::parse(in);
  }
  m["info"].erase("config");
  std::ofstream(manifest) << m.dump(2);
  // Fewer blocks: the checkpoint holds tensors the model does not have.
  expect_refused(dir, with(tiny_args(dir, 1, 4), {"--resume"}),
                 "tensors this model does not train: h.2.attn.c_attn.bias, h.2.attn.c_attn.weight");
  // More blocks: it lacks some.
  expect_refused(dir, with(tiny_args(dir, 1, 4), {"--set", "model.n_layer=5", "--resume"}),
                 "tensors this run trains that it lacks: h.4.attn.c_attn.bias");
}

TEST(ResumeModel, FineTuningAlsoComparesWhatIsFrozenAndWhereItComesFrom) {
  crosstrain::train::Config saved = tiny_config("resume_model_freeze");
  saved.model_init_from = "/models/base";
  saved.train.freeze = "0";
  crosstrain::train::Config run = saved;
  EXPECT_EQ(crosstrain::train::resume_differences(saved, run), std::vector<std::string>{});
  run.train.freeze = "0-1";
  EXPECT_EQ(crosstrain::train::resume_differences(saved, run),
            std::vector<std::string>{"train.freeze: \"0\" -> \"0-1\""});
  run.train.freeze = "0";
  run.model_init_from = "/models/other";
  EXPECT_EQ(crosstrain::train::resume_differences(saved, run),
            std::vector<std::string>{"model.init_from: \"/models/base\" -> \"/models/other\""});
  // Nothing frozen: the run's own checkpoint holds every weight, init_from is not read again.
  saved.train.freeze = run.train.freeze = "";
  EXPECT_EQ(crosstrain::train::resume_differences(saved, run), std::vector<std::string>{});
}

TEST(ResumeModel, TheSavedConfigIsReadForItsModelOnly) {
  // Keys of another version elsewhere do not stop a resume; the [model] and [dlrm] sections are what counts.
  const auto c = crosstrain::train::saved_model_config(
      "[run]\nname = \"x\"\nretired_key = 1\n[gone]\na = 1\n[model]\nn_layer = 6\narch = \"llama\"\n"
      "[dlrm]\nembedding_dim = 8\n[train]\nfreeze = \"0\"\nother = 2\n",
      "test");
  EXPECT_EQ(c.model.n_layer, 6);
  EXPECT_EQ(c.model.arch, crosstrain::models::ModelArch::Llama);
  EXPECT_EQ(c.dlrm.embedding_dim, 8);
  EXPECT_EQ(c.train.freeze, "0");
  EXPECT_THROW(crosstrain::train::saved_model_config("[model]\nn_layers = 6\n", "test"), crosstrain::UsageError);
}

TEST(ResumeModel, ALongerScheduleResumesWithANotice) {
  const std::string dir = copy_of_trained_run("resume_model_schedule");
  auto r = run_process(with(tiny_args(dir, 1, 4), {"--set", "model.n_layer=4", "--resume"}), {}, milliseconds(120000));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_TRUE(contains(r.output, "notice: train.steps = 4 where the checkpoint's run had 2")) << r.output;
  // The same length again (the newest checkpoint is now the 4-step run's): nothing to announce.
  auto same = run_process(with(tiny_args(dir, 1, 4), {"--set", "model.n_layer=4", "--resume"}), {}, milliseconds(120000));
  EXPECT_FALSE(contains(same.output, "where the checkpoint's run had")) << same.output;
}
