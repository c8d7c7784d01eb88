// train.recompute: recomputing the attention core (selective) or whole blocks (full) in backward leaves losses,
// gradients and parameters bit-identical to saving every activation, in every layout, and full recompute keeps
// far fewer activation bytes (counted at the allocator). Ranks are threads (in-process back end).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "crosstrain/core/memory_counter.h"
#include "crosstrain/models/recompute.h"
#include "in_process_run.h"
#include "train_fixture.h"

using namespace crosstrain;

namespace {

struct Layout {
  int dp = 1, pp = 1, tp = 1;
  int zero = 0;
  std::string schedule = "1f1b";
  bool sequence_parallel = false;
};

struct Outcome {
  std::vector<double> losses;
  std::vector<std::vector<float>> params;                    // per rank, after the last step
  std::vector<std::map<std::string, at::Tensor>> gradients;  // per rank (empty under ZeRO)
};

train::Config config_for(const std::string& tag, const Layout& l, const std::string& recompute) {
  auto c = crosstrain::testing::tiny_config(tag + "_" + recompute);
  c.model.n_layer = 4;
  c.model.n_head = 4;
  c.train.steps = 4;
  c.parallel.dp = l.dp;
  c.parallel.pp = l.pp;
  c.parallel.tp = l.tp;
  c.parallel.zero = l.zero;
  c.parallel.schedule = l.schedule;
  c.parallel.sequence_parallel = l.sequence_parallel;
  if (l.pp > 1) c.train.micro_batches = 4;
  c.train.recompute = recompute;
  return c;
}

Outcome run(const train::Config& c, int world) {
  Outcome out;
  const auto ranks = crosstrain::testing::train_in_process(c, world);
  for (const auto& s : ranks[0].result.steps) out.losses.push_back(s.loss);
  for (const auto& r : ranks) {
    out.params.push_back(r.dump.flat);
    out.gradients.push_back(r.dump.gradients);
  }
  return out;
}

void expect_identical(const Outcome& got, const Outcome& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < got.losses.size(); ++i) EXPECT_EQ(got.losses[i], want.losses[i]) << what << " step " << i + 1;
  for (size_t r = 0; r < got.params.size(); ++r) {
    EXPECT_EQ(got.params[r], want.params[r]) << what << ": rank " << r << "'s parameters differ";
    ASSERT_EQ(got.gradients[r].size(), want.gradients[r].size()) << what;
    for (const auto& [name, g] : got.gradients[r])
      EXPECT_TRUE(torch::equal(g, want.gradients[r].at(name))) << what << " rank " << r << " " << name;
  }
}

// ZeRO's reductions on the in-process back end sum in the order the rank threads arrive, so two runs of the
// same configuration already differ in the last bits: within float rounding there.
void expect_close(const Outcome& got, const Outcome& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < got.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[i], 1e-6 * std::abs(want.losses[i])) << what << " step " << i + 1;
  for (size_t r = 0; r < got.params.size(); ++r) {
    ASSERT_EQ(got.params[r].size(), want.params[r].size()) << what;
    for (size_t i = 0; i < got.params[r].size(); ++i)
      ASSERT_NEAR(got.params[r][i], want.params[r][i], 1e-6) << what << " rank " << r << " parameter element " << i;
  }
}

void check_layout(const Layout& l, const std::string& tag) {
  const int world = l.dp * l.pp * l.tp;
  const Outcome none = run(config_for(tag, l, "none"), world);
  ASSERT_FALSE(none.losses.empty());
  EXPECT_LT(none.losses.back(), none.losses.front()) << tag << " learns";
  for (const char* mode : {"selective", "full"}) {
    const Outcome got = run(config_for(tag, l, mode), world);
    if (l.zero == 0)
      expect_identical(got, none, tag + " recompute=" + mode);
    else
      expect_close(got, none, tag + " recompute=" + mode);
  }
}

int64_t last_activation_bytes(const train::Config& c) {
  std::ifstream in(c.run.dir + "/metrics.jsonl");
  std::string line, last;
  while (std::getline(in, line))
    if (line.find("activation_peak_bytes") != std::string::npos) last = line;
  EXPECT_FALSE(last.empty()) << "no activation_peak_bytes in " << c.run.dir << "/metrics.jsonl";
  return last.empty() ? 0 : nlohmann::json::parse(last).at("activation_peak_bytes").get<int64_t>();
}

}  // namespace

TEST(Recompute, SingleProcessIsBitIdentical) { check_layout({}, "rc_single"); }
TEST(Recompute, DataParallelIsBitIdentical) { check_layout({2, 1, 1}, "rc_dp2"); }
TEST(Recompute, TensorAndSequenceParallelIsBitIdentical) { check_layout({1, 1, 2, 0, "1f1b", true}, "rc_tp2sp"); }
TEST(Recompute, PipelineOneFOneBIsBitIdentical) { check_layout({1, 2, 1, 0, "1f1b"}, "rc_pp2"); }
TEST(Recompute, PipelineZeroBubbleIsBitIdentical) { check_layout({1, 2, 1, 0, "zb-h1"}, "rc_pp2zb"); }
TEST(Recompute, ZeroStage3IsBitIdentical) { check_layout({2, 1, 1, 3}, "rc_zero3"); }

TEST(Recompute, DropoutMasksAreReplayed) {
  // The recomputed forward draws the same dropout masks: the random state is restored for it.
  Layout l;
  auto c = [&](const std::string& mode) {
    auto cfg = config_for("rc_dropout", l, mode);
    cfg.model.dropout = 0.2;
    return cfg;
  };
  const Outcome none = run(c("none"), 1);
  expect_identical(run(c("full"), 1), none, "dropout, full");
  expect_identical(run(c("selective"), 1), none, "dropout, selective");
}

TEST(Recompute, FullRecomputeKeepsFewerActivationBytes) {
  Layout l;
  std::map<std::string, int64_t> bytes;
  for (const char* mode : {"none", "selective", "full"}) {
    auto c = config_for("rc_bytes", l, mode);
    c.model.n_layer = 6;
    c.model.n_embd = 64;
    c.model.block_size = 64;
    c.train.steps = 2;
    run(c, 1);
    bytes[mode] = last_activation_bytes(c);
  }
  // Counted at the allocator: the saved activations of 6 blocks against one block's, plus embedding and head.
  EXPECT_GT(bytes["none"], 0);
  EXPECT_LT(bytes["full"], bytes["none"] * 0.5) << "full " << bytes["full"] << " none " << bytes["none"];
  EXPECT_LT(bytes["selective"], bytes["none"]) << "selective " << bytes["selective"] << " none " << bytes["none"];
}

TEST(Recompute, UnknownModeIsAClearError) {
  try {
    models::parse_recompute("some");
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("\"selective\""), std::string::npos) << e.what();
  }
}

TEST(MemoryCounter, CountsTensorsAliveAndTheirPeak) {
  install_memory_counter();
  MemoryWatermark w;
  const int64_t before = counted_bytes_in_use();
  {
    at::Tensor a = at::empty({1000}, at::kFloat);
    EXPECT_EQ(counted_bytes_in_use() - before, 4000);
    at::Tensor b = at::empty({500}, at::kDouble);
  }
  EXPECT_EQ(counted_bytes_in_use(), before);
  EXPECT_EQ(w.peak_above_baseline(), 8000);
}
