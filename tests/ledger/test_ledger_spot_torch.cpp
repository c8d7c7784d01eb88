// The ledger's spot check with a real recomputation: each step of job "mlp" is the gradient of a small MLP's
// loss (libtorch autograd) at parameters and data derived from the step index. An honest cluster reports the
// digest of its gradient bytes for every step it computed; fakers report steps they never computed (random
// digests), inflate their tokens and FLOPs, or claim another cluster's steps. The checker recomputes sampled steps
// itself and must flag every faker and not the honest cluster.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "crosstrain/ledger/ledger.h"
#include "scratch.h"

using namespace crosstrain::scheduler;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kBatch = 16, kIn = 8, kHidden = 16;
constexpr double kParams = kIn * kHidden + kHidden + kHidden + 1;  // 161

// One training step's gradient of job "mlp": tanh MLP, mean squared error, parameters and batch from `step`.
std::string mlp_step_digest(int64_t step) {
  const auto f = torch::kFloat32;
  const double s = static_cast<double>(step);
  auto w1 = (torch::sin(torch::arange(kIn * kHidden, f) * 0.7 + s * 0.01) * 0.3).reshape({kIn, kHidden}).requires_grad_();
  auto b1 = (torch::cos(torch::arange(kHidden, f) * 0.3 + s * 0.02) * 0.1).requires_grad_();
  auto w2 = (torch::sin(torch::arange(kHidden, f) * 1.1 - s * 0.03) * 0.3).reshape({kHidden, 1}).requires_grad_();
  auto b2 = torch::full({1}, 0.05 * std::sin(s), torch::TensorOptions().dtype(f)).requires_grad_();
  const auto x = torch::cos(torch::arange(kBatch * kIn, f) * 0.37 + s * 1.3).reshape({kBatch, kIn});
  const auto y = torch::sin(x.sum(1, true));
  const auto loss = torch::mse_loss(torch::matmul(torch::tanh(torch::matmul(x, w1) + b1), w2) + b2, y);
  loss.backward();
  std::string bytes;
  for (const auto& p : {w1, b1, w2, b2}) {
    const auto g = p.grad().contiguous();
    bytes.append(static_cast<const char*>(g.data_ptr()), g.numel() * sizeof(float));
  }
  return ledger_digest(bytes.data(), bytes.size());
}

std::string random_digest(std::mt19937_64& rng) {
  const uint64_t words[4] = {rng(), rng(), rng(), rng()};
  return ledger_digest(words, sizeof words);
}

// What a cluster claims for steps [first, first + steps) of job "mlp": honest figures and true digests, unless
// `fake_every` > 0 (then every fake_every-th step it did not compute and reports a random digest).
LedgerEntry contribution(const std::string& cluster, int64_t first, int64_t steps, int fake_every, std::mt19937_64& rng) {
  LedgerEntry e;
  e.cluster = cluster;
  e.job = "mlp";
  e.interval_start = 1800000000 + first;
  e.interval_end = e.interval_start + steps;
  e.first_step = first;
  e.steps = steps;
  e.tokens = steps * kBatch;
  e.flops = 6.0 * kParams * static_cast<double>(e.tokens);
  e.bytes = steps * static_cast<int64_t>(kParams) * 4;
  for (int64_t s = first; s < first + steps; ++s)
    e.gradient_digests[s] = fake_every > 0 && (s - first) % fake_every == 0 ? random_digest(rng) : mlp_step_digest(s);
  return e;
}

}  // namespace

TEST(LedgerSpotCheck, RecomputedGradientsCatchFakersAndClearTheHonest) {
  torch::set_num_threads(1);
  ASSERT_EQ(mlp_step_digest(3), mlp_step_digest(3));  // the recomputation is deterministic...
  ASSERT_NE(mlp_step_digest(3), mlp_step_digest(4));  // ... and depends on the step
  const fs::path dir = crosstrain::testing::scratch_dir("ledger-spot");
  const std::string path = (dir / "ledger.jsonl").string();
  std::map<std::string, LedgerKey> keys;
  PublicKeys public_keys;
  for (const char* name : {"honest", "no-work", "inflator", "claim-jumper"}) {
    keys[name] = generate_ledger_key(name);
    public_keys[name] = keys[name].public_key;
  }
  std::mt19937_64 rng(1234);
  auto add = [&](const LedgerEntry& e) { append_ledger(path, e, keys.at(e.cluster), public_keys); };
  add(contribution("honest", 0, 8, 0, rng));
  add(contribution("no-work", 8, 8, 1, rng));  // computed nothing: every digest random
  LedgerEntry inflated = contribution("inflator", 16, 8, 0, rng);
  inflated.tokens *= 4;  // real gradients, four times the tokens
  inflated.flops *= 4;
  add(inflated);
  add(contribution("honest", 24, 8, 0, rng));
  add(contribution("claim-jumper", 4, 6, 0, rng));  // honest's steps 4-9, again
  add(contribution("honest", 32, 8, 0, rng));

  // Anyone with the keys verifies the chain, then spot-checks what it holds.
  const LedgerVerifyReport chain = verify_ledger(path, public_keys);
  ASSERT_TRUE(chain.ok) << chain.message();
  SpotCheckOptions options;
  options.seed = 2026;
  options.samples_per_entry = 2;
  options.jobs["mlp"] = {kBatch, 6.0 * kParams};
  int recomputed = 0;
  const Recompute recompute = [&](const std::string& job, int64_t step) {
    ++recomputed;
    return job == "mlp" ? mlp_step_digest(step) : std::string();
  };
  const SpotCheckReport report = spot_check(chain.parsed, options, recompute);
  for (const auto& flag : report.flags) std::printf("flag %s (seq %lld): %s\n", flag.cluster.c_str(), static_cast<long long>(flag.seq), flag.reason.c_str());
  EXPECT_EQ(report.flagged_clusters(), (std::vector<std::string>{"claim-jumper", "inflator", "no-work"}));
  bool jumper_named_honest = false;
  for (const auto& flag : report.flags)
    jumper_named_honest |= flag.cluster == "claim-jumper" &&
                           flag.reason.find("claims step 4 of job 'mlp', already claimed by cluster 'honest'") != std::string::npos;
  EXPECT_TRUE(jumper_named_honest);
  EXPECT_EQ(recomputed, 12);  // 2 sampled steps of each of 6 entries: a small fraction of the 46 claimed
  EXPECT_EQ(report.steps_recomputed, 12);
  EXPECT_EQ(report.steps_matched, 10);  // all but no-work's two
  // The sample is reproducible: a second checker with the same seed recomputes the same steps.
  for (const auto& e : chain.parsed) EXPECT_EQ(sample_steps(e, 2026, 2), sample_steps(e, 2026, 2));
  fs::remove_all(dir);
}

TEST(LedgerSpotCheck, APartialFakerIsCaughtByEnoughSamples) {
  torch::set_num_threads(1);
  // Computes only every other step of 16 and fakes the rest: with 4 samples an entry escapes with probability
  // C(8,4)/C(16,4) = 70/1820 ~ 4%; over four entries the chance that all escape is ~2e-6, and the seed is fixed.
  std::mt19937_64 rng(99);
  std::vector<LedgerEntry> entries;
  const LedgerKey key = generate_ledger_key("half");
  std::string head;
  for (int i = 0; i < 4; ++i) {
    entries.push_back(contribution("half", i * 16, 16, 2, rng));
    seal_entry(entries.back(), i + 1, head, key);
    head = entries.back().hash;
  }
  SpotCheckOptions options;
  options.seed = 7;
  options.samples_per_entry = 4;
  options.jobs["mlp"] = {kBatch, 6.0 * kParams};
  const auto report = spot_check(entries, options, [](const std::string&, int64_t step) { return mlp_step_digest(step); });
  EXPECT_EQ(report.flagged_clusters(), std::vector<std::string>{"half"});
  EXPECT_GT(report.steps_matched, 0);                                 // its real steps do match
  EXPECT_LT(report.steps_matched, report.steps_recomputed);            // and its fake ones do not
}
