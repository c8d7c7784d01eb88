// Pure parts of training: schedule, sampler, config, tokenizer, safetensors.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "crosstrain/checkpoint/safetensors.h"
#include "crosstrain/core/error.h"
#include "crosstrain/data/sampler.h"
#include "crosstrain/data/tokenizer.h"
#include "crosstrain/train/config.h"
#include "crosstrain/train/lr_schedule.h"

using namespace crosstrain;
namespace fs = std::filesystem;

namespace {
std::string temp_file(const std::string& name, const std::string& content) {
  fs::path p = fs::path(::testing::TempDir()) / name;
  std::ofstream(p) << content;
  return p.string();
}
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST(Schedule, WarmupThenCosine) {
  EXPECT_DOUBLE_EQ(train::learning_rate(1, 10, 100, 1.0, 0.1), 0.1);
  EXPECT_DOUBLE_EQ(train::learning_rate(10, 10, 100, 1.0, 0.1), 1.0);
  EXPECT_NEAR(train::learning_rate(55, 10, 100, 1.0, 0.1), 0.55, 1e-12);  // halfway down the cosine
  EXPECT_DOUBLE_EQ(train::learning_rate(100, 10, 100, 1.0, 0.1), 0.1);
  EXPECT_DOUBLE_EQ(train::learning_rate(5, 0, 0, 1.0, 0.1), 1.0);
  for (int s = 11; s < 100; ++s)
    EXPECT_LE(train::learning_rate(s + 1, 10, 100, 1.0, 0.1), train::learning_rate(s, 10, 100, 1.0, 0.1));
}

TEST(Sampler, RanksGetDisjointSlicesOfTheSameGlobalBatch) {
  const int dp = 4, micro = 2;
  data::DistributedSampler reference(7, 100000, 64, 16, 0, 1, 1);
  for (int64_t step : {1, 2, 99}) {
    auto global = reference.global_offsets(step);
    std::vector<int64_t> joined;
    for (int r = 0; r < dp; ++r) {
      data::DistributedSampler s(7, 100000, 64, 16, r, dp, micro);
      EXPECT_EQ(s.local_micro_batch(), 2);
      for (int m = 0; m < micro; ++m) {
        auto part = s.local_offsets(step, m);
        joined.insert(joined.end(), part.begin(), part.end());
      }
    }
    EXPECT_EQ(joined, global);  // in order: rank-major, then micro-batch
    for (auto o : global) {
      EXPECT_GE(o, 0);
      EXPECT_LT(o, 100000 - 64);
    }
  }
  EXPECT_NE(reference.global_offsets(1), reference.global_offsets(2));
  EXPECT_NE(reference.global_offsets(1), data::DistributedSampler(8, 100000, 64, 16, 0, 1, 1).global_offsets(1));
}

TEST(Sampler, UnevenSlicesStayDisjointAndCoverTheGlobalBatch) {
  const std::vector<int64_t> shares{6, 6, 2, 2};  // sync.cluster_batch = "12,4" over 2 clusters x 2 ranks
  data::DistributedSampler reference(7, 100000, 64, 16, 0, 1, 1);
  for (int64_t step : {1, 5}) {
    std::vector<int64_t> joined;
    for (int r = 0; r < 4; ++r) {
      data::DistributedSampler s(7, 100000, 64, 16, r, 4, 2, shares);
      EXPECT_EQ(s.local_batch(), shares[r]);
      EXPECT_EQ(s.local_micro_batch(), shares[r] / 2);
      for (int m = 0; m < 2; ++m) {
        auto part = s.local_offsets(step, m);
        joined.insert(joined.end(), part.begin(), part.end());
      }
    }
    EXPECT_EQ(joined, reference.global_offsets(step));
  }
  // Shares that miss the global batch, a rank, or the micro-batches are refused.
  EXPECT_THROW(data::DistributedSampler(7, 100000, 64, 16, 0, 4, 2, {6, 6, 2, 4}), UsageError);
  EXPECT_THROW(data::DistributedSampler(7, 100000, 64, 16, 0, 4, 2, {8, 6, 2}), UsageError);
  EXPECT_THROW(data::DistributedSampler(7, 100000, 64, 16, 0, 4, 2, {7, 5, 2, 2}), UsageError);
}

TEST(Sampler, StateRoundTripsAndChecksTheSeed) {
  data::DistributedSampler s(3, 1000, 10, 4, 0, 2, 1);
  s.mark_done(41);
  EXPECT_EQ(s.state().next_step, 42);
  data::DistributedSampler t(3, 1000, 10, 4, 0, 2, 1);
  t.restore(s.state());
  EXPECT_EQ(t.state().next_step, 42);
  data::DistributedSampler other(4, 1000, 10, 4, 0, 2, 1);
  EXPECT_THROW(other.restore(s.state()), UsageError);
}

TEST(Sampler, BatchNotDivisibleByRanksIsAClearError) {
  auto what = error_of([] { data::DistributedSampler(1, 1000, 10, 6, 0, 4, 1); });
  EXPECT_NE(what.find("global_batch = 6 is not divisible by 4"), std::string::npos) << what;
  EXPECT_NE(error_of([] { data::DistributedSampler(1, 5, 10, 4, 0, 1, 1); }).find("fewer than one sequence"),
            std::string::npos);
}

TEST(Config, LoadsOverridesAndPrints) {
  auto path = temp_file("ok.toml", "[train]\nsteps = 7\nlr = 3e-4\n[model]\nn_layer = 3\n");
  auto c = train::load_config(path, {"train.global_batch=32", "run.dir=/tmp/x y", "data.path=\"a b\"",
                                     "model.dropout=0.25", "train.lr=1"});
  EXPECT_EQ(c.train.steps, 7);
  EXPECT_EQ(c.train.global_batch, 32);
  EXPECT_DOUBLE_EQ(c.train.lr, 1.0);  // integers are accepted for numbers
  EXPECT_EQ(c.model.n_layer, 3);
  EXPECT_EQ(c.run.dir, "/tmp/x y");
  EXPECT_EQ(c.data.path, "a b");
  EXPECT_DOUBLE_EQ(c.model.dropout, 0.25);
  // The resolved config reads back to the same values.
  auto again = train::load_config(temp_file("resolved.toml", train::to_toml(c)));
  EXPECT_EQ(train::to_toml(again), train::to_toml(c));
}

TEST(Config, ConfigsSavedBeforeTheMicroBatchRenameStillLoad) {
  // Every checkpoint manifest and run.dir/config.toml written before it holds the old key at its default.
  const auto c = train::parse_config("[parallel]\nmicrobatches = 0\npp = 2\n[train]\nmicro_batches = 4\n", "old manifest");
  EXPECT_EQ(c.parallel.pp, 2);
  EXPECT_EQ(c.train.micro_batches, 4);
  // A value a saved config holds carries over as it meant then (the old key took precedence)...
  const auto saved = train::parse_config("[parallel]\nmicrobatches = 8\n[train]\nmicro_batches = 2\n", "old manifest");
  EXPECT_EQ(saved.train.micro_batches, 8);
  // ... and a value someone chose in a recipe is not dropped without a word: it names the key that holds it now.
  const auto recipe = temp_file("old_recipe.toml", "[parallel]\nmicrobatches = 8\n");
  const auto what = error_of([&] { train::load_config(recipe); });
  EXPECT_NE(what.find("'parallel.microbatches' in " + recipe + " is now train.micro_batches"), std::string::npos)
      << what;
}

TEST(Config, NumbersPrintInTheirShortestExactForm) {
  train::Config c;
  c.data.val_fraction = 0.1;
  c.model.norm_eps = 1e-5;
  c.train.lr = 3e-4;
  const std::string toml = train::to_toml(c);
  for (const char* line : {"val_fraction = 0.1\n", "norm_eps = 1e-05\n", "lr = 0.0003\n", "outer_lr = 0.7\n"})
    EXPECT_NE(toml.find(line), std::string::npos) << line << " in\n" << toml;
  // And read back exactly.
  const auto back = train::parse_config(toml, "printed");
  EXPECT_EQ(back.data.val_fraction, 0.1);
  EXPECT_EQ(back.model.norm_eps, 1e-5);
  EXPECT_EQ(back.train.lr, 3e-4);
}

TEST(Config, UnknownKeysAndWrongTypesAreNamed) {
  auto path = temp_file("bad.toml", "[train]\nstepz = 7\n");
  auto what = error_of([&] { train::load_config(path); });
  EXPECT_NE(what.find("unknown key 'train.stepz'"), std::string::npos) << what;
  EXPECT_NE(what.find("valid keys of [train]: steps, global_batch"), std::string::npos) << what;
  EXPECT_NE(what.find("did you mean 'train.steps'?"), std::string::npos) << what;
  what = error_of([&] { train::load_config(temp_file("b2.toml", "[trian]\nsteps = 1\n")); });
  EXPECT_NE(what.find("unknown section [trian]"), std::string::npos) << what;
  EXPECT_NE(what.find("did you mean 'train.steps'?"), std::string::npos) << what;
  // A key of another section, or nothing close at all.
  what = error_of([&] { train::load_config(temp_file("b5.toml", "[train]\nlog_every = 5\n")); });
  EXPECT_NE(what.find("did you mean 'run.log_every'?"), std::string::npos) << what;
  what = error_of([&] { train::load_config(temp_file("b6.toml", "[train]\nflux_capacitor = 5\n")); });
  EXPECT_EQ(what.find("did you mean"), std::string::npos) << what;
  EXPECT_NE(what.find("valid keys of [train]"), std::string::npos) << what;
  what = error_of([&] { train::load_config(temp_file("b3.toml", "[train]\nsteps = \"many\"\n")); });
  EXPECT_NE(what.find("train.steps"), std::string::npos) << what;
  EXPECT_NE(what.find("must be an integer"), std::string::npos) << what;
  what = error_of([&] { train::load_config(temp_file("b4.toml", "[train\nsteps = 1\n")); });
  EXPECT_NE(what.find("line 1"), std::string::npos) << what;
  what = error_of([&] { train::load_config("/nonexistent/x.toml"); });
  EXPECT_NE(what.find("cannot read config file '/nonexistent/x.toml'"), std::string::npos) << what;
  what = error_of([&] { train::load_config(temp_file("ok2.toml", ""), {"train.steps"}); });
  EXPECT_NE(what.find("section.key=value"), std::string::npos) << what;
  what = error_of([&] { train::load_config(temp_file("ok3.toml", ""), {"train.lr=fast"}); });
  EXPECT_NE(what.find("train.lr"), std::string::npos) << what;
}

// [comm] maps onto the communication layer's own struct; [debug] holds the test-only switches, printed and
// checked like every other section.
TEST(Config, CommAndDebugSections) {
  auto c = train::load_config(temp_file("comm.toml", "[comm]\ntimeout_s = 0.3\nalgo = \"ring\"\n"),
                              {"debug.fault_save_delay_ms=250", "debug.fault_commit_rename=true"});
  EXPECT_EQ(c.comm.timeout(), comm::Millis(300));  // rounded, not truncated
  EXPECT_EQ(c.comm.algo, "ring");
  EXPECT_EQ(c.debug.checkpoint.save_delay_ms, 250);
  EXPECT_TRUE(c.debug.checkpoint.commit_rename);
  const std::string toml = train::to_toml(c);
  EXPECT_NE(toml.find("[debug]\nfault_save_delay_ms = 250\nfault_commit_rename = true\n"), std::string::npos) << toml;
  // The defaults inject nothing.
  const train::Config plain;
  EXPECT_EQ(plain.debug.checkpoint.save_delay_ms, 0);
  EXPECT_FALSE(plain.debug.checkpoint.commit_rename);
  EXPECT_EQ(plain.comm.timeout(), comm::Millis(30000));
  auto what = error_of([&] { train::load_config(temp_file("dbg.toml", ""), {"debug.fault_rename=1"}); });
  EXPECT_NE(what.find("valid keys of [debug]: fault_save_delay_ms, fault_commit_rename"), std::string::npos) << what;
  what = error_of([&] { train::load_config(temp_file("dbg2.toml", ""), {"debug.fault_save_delay_ms=-1"}); });
  EXPECT_NE(what.find("debug.fault_save_delay_ms = -1"), std::string::npos) << what;
}

TEST(Tokenizer, ByteRoundTrip) {
  data::ByteTokenizer tok;
  std::string text = "Hello, wörld!\n\t%";
  auto ids = tok.encode(text);
  EXPECT_EQ(ids.size(), text.size());
  EXPECT_EQ(tok.decode(std::vector<int64_t>(ids.begin(), ids.end())), text);
  EXPECT_EQ(tok.decode({72, 300}), "H<300>");
}

TEST(Safetensors, RoundTripAndTruncation) {
  auto path = (fs::path(::testing::TempDir()) / "t.safetensors").string();
  auto a = at::arange(12, at::kFloat).reshape({3, 4});
  auto b = at::tensor({1, 2, 3}, at::kLong);
  checkpoint::write_safetensors(path, {{"layer.a", a}, {"b", b}}, {{"step", "5"}});
  // The layout of the format: u64 header length, then a JSON header.
  std::ifstream raw(path, std::ios::binary);
  unsigned char len[8];
  raw.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(len[i]) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(fs::file_size(path), 8 + n + 12 * 4 + 3 * 8);
  auto f = checkpoint::read_safetensors(path);
  EXPECT_TRUE(at::equal(f.tensors.at("layer.a"), a));
  EXPECT_TRUE(at::equal(f.tensors.at("b"), b));
  EXPECT_EQ(f.metadata.at("step"), "5");
  fs::resize_file(path, fs::file_size(path) - 5);
  auto what = error_of([&] { checkpoint::read_safetensors(path); });
  EXPECT_NE(what.find("truncated"), std::string::npos) << what;
  EXPECT_NE(what.find(path), std::string::npos) << what;
}

TEST(Config, BadValuesAreRefusedAtLoadNamingTheKey) {
  const auto path = temp_file("ranges.toml", "[train]\nsteps = 10\n");
  EXPECT_EQ(error_of([&] { train::load_config(path); }), "no error");
  // Each bad value, as an override and written in the file, is refused with its key (not a later symptom).
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"train.lr=nan", "train.lr"},
      {"train.lr=inf", "train.lr"},
      {"train.lr=-inf", "train.lr"},
      {"train.warmup_steps=-1", "train.warmup_steps = -1"},
      {"train.grad_clip=-0.5", "train.grad_clip = -0.5"},
      {"train.checkpoint_every=-10", "train.checkpoint_every = -10"},
      {"comm.timeout_s=0", "comm.timeout_s = 0"},
      {"comm.timeout_s=-5", "comm.timeout_s = -5"},
      {"comm.timeout_s=nan", "comm.timeout_s"},
      {"comm.timeout_s=1e20", "comm.timeout_s = 1e+20 must be at most 604800"},
      {"comm.timeout_s=604801", "comm.timeout_s = 604801 must be at most 604800"},
      {"train.global_batch=0", "train.global_batch = 0"},
      {"train.global_batch=-8", "train.global_batch = -8"},
  };
  for (const auto& [assignment, key] : cases) {
    auto what = error_of([&] { train::load_config(path, {assignment}); });
    EXPECT_NE(what.find(key), std::string::npos) << assignment << ": " << what;
    EXPECT_EQ(what.find('\n'), std::string::npos) << what;
  }
  auto what = error_of([&] { train::load_config(path, {"train.lr=inf"}); });
  EXPECT_NE(what.find("finite"), std::string::npos) << what;
  what = error_of([&] { train::load_config(temp_file("nan.toml", "[train]\nlr = nan\n")); });
  EXPECT_NE(what.find("train.lr"), std::string::npos) << what;
  EXPECT_NE(what.find("finite"), std::string::npos) << what;
  what = error_of([&] { train::load_config(temp_file("timeout.toml", "[comm]\ntimeout_s = -1\n")); });
  EXPECT_NE(what.find("comm.timeout_s = -1 must be positive"), std::string::npos) << what;
  // Zero is a meaningful value where the comment says so.
  EXPECT_EQ(error_of([&] {
              train::load_config(path, {"train.warmup_steps=0", "train.grad_clip=0", "train.checkpoint_every=0",
                                        "comm.timeout_s=604800"});
            }),
            "no error");
}
