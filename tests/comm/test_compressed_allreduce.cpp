// compressed_all_reduce over the in-process back end: every rank gets the same bits, close to the true average
// within the codec's bound; bytes against the uncompressed all-reduce; error feedback across steps.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <iomanip>
#include <iostream>
#include <string>
#include <tuple>
#include <vector>

#include "crosstrain/comm/compression/codecs.h"
#include "crosstrain/comm/backends/fake.h"

using namespace crosstrain;
using comm::FakeWorld;

namespace {

const std::vector<std::string> kSpecs = {"none", "bf16", "fp16", "int8", "int4", "topk:0.1", "powersgd:3"};
const std::vector<int64_t> kSizes = {0, 1, 7, 1000, 4099};

// Rank `rank`'s gradient: normal values whose magnitude varies along the buffer.
at::Tensor rank_input(int rank, int64_t n, uint64_t salt = 0) {
  at::Generator gen = at::detail::createCPUGenerator(1000 * salt + 17 * rank + 1);
  at::Tensor x = at::randn({n}, gen, at::kFloat);
  return x.mul_(at::exp(at::randn({n}, gen, at::kFloat)));
}

// Sum in rank order, then divide: the plain all-reduce's average.
at::Tensor true_average(const std::vector<at::Tensor>& inputs) {
  at::Tensor sum = inputs[0].clone();
  for (size_t i = 1; i < inputs.size(); ++i) sum.add_(inputs[i]);
  return sum.div_(static_cast<double>(inputs.size()));
}

at::Tensor mean_of(const std::vector<at::Tensor>& ts) {
  at::Tensor sum = at::zeros_like(ts[0]);
  for (const auto& t : ts) sum.add_(t);
  return sum.div_(static_cast<double>(ts.size()));
}

struct Outcome {
  std::vector<at::Tensor> results;  // per rank
  std::vector<comm::CompressedAllReduceStats> stats;
};

Outcome run_once(const std::string& spec, int n, const std::vector<at::Tensor>& inputs) {
  Outcome out{std::vector<at::Tensor>(n), std::vector<comm::CompressedAllReduceStats>(n)};
  FakeWorld::run(n, [&](comm::Communicator& c) {
    auto codec = comm::make_codec(spec);
    at::Tensor buffer = inputs[c.rank()].clone();
    out.stats[c.rank()] = comm::compressed_all_reduce(c, buffer, *codec, nullptr, /*buffer_id=*/5);
    out.results[c.rank()] = buffer;
  });
  return out;
}

// Largest violation of |result - average| <= bound; <= 0 when it holds everywhere.
float worst_excess(const at::Tensor& result, const at::Tensor& average, const at::Tensor& bound) {
  return ((result - average).abs() - bound).max().item<float>();
}

// Checks the codec's documented bound against the true average of `inputs`.
void expect_within_bound(const std::string& spec, const std::vector<at::Tensor>& inputs, const at::Tensor& result) {
  const int n = static_cast<int>(inputs.size());
  const int64_t numel = result.numel();
  at::Tensor average = true_average(inputs);
  std::vector<at::Tensor> magnitudes;
  for (const auto& x : inputs) magnitudes.push_back(x.abs());
  at::Tensor mean_abs = mean_of(magnitudes);
  at::Tensor rounding = mean_abs * 1e-5;  // float32 sums of n terms
  if (spec == "none") {
    EXPECT_TRUE(at::equal(result, average));
  } else if (spec == "bf16" || spec == "fp16") {
    // Two roundings, of each input and of the average, each <= u relative.
    const double u = std::ldexp(1.0, spec == "bf16" ? -8 : -11);
    at::Tensor bound = (mean_abs + average.abs()) * (u * 1.001) + rounding + std::ldexp(1.0, -23);
    EXPECT_LE(worst_excess(result, average, bound), 0.f) << spec << " n=" << n << " numel=" << numel;
  } else if (spec == "int8" || spec == "int4") {
    // Each input loses <= s_i / 2; the average's own scale is <= the mean of the s_i, and it loses half of that.
    comm::QuantizeCodec codec(spec == "int8" ? 8 : 4);
    std::vector<at::Tensor> scales;
    for (const auto& x : inputs)
      scales.push_back(codec.scales(x).repeat_interleave(codec.block()).narrow(0, 0, numel));
    at::Tensor bound = mean_of(scales) * 1.0001 + rounding;
    EXPECT_LE(worst_excess(result, average, bound), 0.f) << spec << " n=" << n << " numel=" << numel;
  } else if (spec.rfind("topk:", 0) == 0) {
    // Exactly the rank-order average of every rank's top-k, and off by what the ranks dropped.
    auto codec = comm::make_codec(spec);
    std::vector<at::Tensor> kept, dropped;
    for (const auto& x : inputs) {
      kept.push_back(codec->decode(codec->encode(x), numel));
      dropped.push_back((x - kept.back()).abs());
    }
    EXPECT_TRUE(at::equal(result, true_average(kept))) << spec << " n=" << n << " numel=" << numel;
    EXPECT_LE(worst_excess(result, average, mean_of(dropped) + rounding), 0.f) << spec << " n=" << n;
  } else {
    // The same power step as one process on the average (same seed, same buffer id), up to float rounding.
    auto codec = comm::make_codec(spec);
    at::Tensor single = codec->decode(codec->encode(average, 5), numel);
    EXPECT_LE((result - single).norm().item<float>(), 1e-3 * average.norm().item<float>() + 1e-6)
        << spec << " n=" << n << " numel=" << numel;
    EXPECT_LE((result - average).norm().item<float>(), average.norm().item<float>() * 1.0001) << spec;
  }
}

}  // namespace

class CompressedAllReduce : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(CompressedAllReduce, EveryRankGetsTheSameBitsWithinTheCodecsBound) {
  const auto& [spec, n] = GetParam();
  for (int64_t numel : kSizes) {
    std::vector<at::Tensor> inputs;
    for (int r = 0; r < n; ++r) inputs.push_back(rank_input(r, numel));
    Outcome out = run_once(spec, n, inputs);
    for (int r = 1; r < n; ++r)
      EXPECT_TRUE(at::equal(out.results[r], out.results[0])) << spec << " n=" << n << " numel=" << numel << " rank " << r;
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(out.stats[r].bytes_sent, out.stats[0].bytes_sent);
      EXPECT_EQ(out.stats[r].bytes_uncompressed, (2 * (n - 1) * 4 * numel + n / 2) / n);
    }
    if (n == 1 || numel == 0) EXPECT_EQ(out.stats[0].bytes_sent, 0);
    if (numel > 0) expect_within_bound(spec, inputs, out.results[0]);
  }
}

INSTANTIATE_TEST_SUITE_P(CodecsAndWorldSizes, CompressedAllReduce,
                         ::testing::Combine(::testing::ValuesIn(kSpecs), ::testing::Range(1, 6)),
                         [](const auto& info) {
                           std::string name = std::get<0>(info.param) + "_np" + std::to_string(std::get<1>(info.param));
                           for (char& ch : name)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return name;
                         });

TEST(CompressedAllReduceBytes, MillionElementBufferOnTwoRanks) {
  const int64_t numel = 1 << 20;
  const int n = 2;
  std::vector<at::Tensor> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(rank_input(r, numel, 1));
  std::cout << "codec        bytes_sent  uncompressed  ratio   (1M float32, 2 ranks, per rank per step)\n";
  for (const std::string& spec : {"none", "bf16", "fp16", "int8", "int4", "topk:0.01", "powersgd:4"}) {
    Outcome out = run_once(spec, n, inputs);
    const auto& s = out.stats[0];
    std::cout << std::left << std::setw(12) << spec << std::right << std::setw(11) << s.bytes_sent << std::setw(14)
              << s.bytes_uncompressed << std::setw(8) << std::fixed << std::setprecision(2) << s.ratio() << "\n";
    EXPECT_EQ(s.bytes_uncompressed, 4 * numel);  // 2(n-1)/n of 4 MiB
    EXPECT_TRUE(at::equal(out.results[0], out.results[1])) << spec;
    expect_within_bound(spec, inputs, out.results[0]);
    if (spec == "none") EXPECT_EQ(s.ratio(), 1.0);
    if (spec == "bf16" || spec == "fp16") EXPECT_EQ(s.ratio(), 2.0);
    if (spec == "int8") EXPECT_GE(s.ratio(), 3.5);
    if (spec == "int4") EXPECT_GE(s.ratio(), 7.5);
    if (spec == "topk:0.01") EXPECT_GE(s.ratio(), 49.0);
    if (spec == "powersgd:4") EXPECT_GE(s.ratio(), 20.0);
  }
}

TEST(CompressedAllReduceBytes, AccountingFollowsTheCollectives) {
  // 3 ranks, 3000 elements: chunks of 1024 (whole int8 blocks), the last one padded.
  const int n = 3;
  const int64_t numel = 3000;
  std::vector<at::Tensor> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(rank_input(r, numel, 2));
  auto bytes = [&](const std::string& spec) { return run_once(spec, n, inputs).stats[0].bytes_sent; };
  EXPECT_EQ(bytes("none"), (2 * 2 * 4 * numel + 1) / 3);               // ring all-reduce: 2(n-1)/n
  EXPECT_EQ(bytes("int8"), 2 * 2 * (1024 + 4 * 4));                    // all-to-all + all-gather of 1024-chunks
  EXPECT_EQ(bytes("bf16"), 2 * 2 * (2 * 1000));                        // chunks of 1000
  EXPECT_EQ(bytes("topk:0.01"), 2 * (30 * 8));                         // (n-1) payloads of 30 entries
  EXPECT_EQ(bytes("powersgd:2"), 2 * ((2 * 2 * 4 * 55 * 2 + 1) / 3));  // P and Q, 55 x 2 each (55 x 55 matrix)
}

TEST(CompressedAllReduce, WorksInPlaceOnAnyContiguousShape) {
  FakeWorld::run(2, [](comm::Communicator& c) {
    auto codec = comm::make_codec("int8");
    at::Tensor buffer = at::full({3, 5}, static_cast<float>(c.rank() + 1));
    comm::compressed_all_reduce(c, buffer, *codec, nullptr, 0);
    EXPECT_EQ(buffer.sizes(), (at::IntArrayRef{3, 5}));
    EXPECT_TRUE(at::allclose(buffer, at::full({3, 5}, 1.5f), 0, 0.02));
    at::Tensor wrong = at::ones({4}, at::kDouble);
    EXPECT_THROW(comm::compressed_all_reduce(c, wrong, *codec, nullptr, 0), UsageError);
  });
}

// Over T steps with error feedback, every input reaches the result eventually: the results add up to T times the
// average, minus what is still held back in the residuals (each rank's input residual, averaged, and the
// residual of each owner's chunk of the average).
// Without feedback the error of the sum grows with the steps. With it, quantization holds back at most one step's
// error; top-k and PowerSGD flush their residuals over many steps (about 1/F for top-k), so they only gain.
void check_feedback_accounting(const std::string& spec, int n, int64_t numel, double gain) {
  const int steps = 12;
  std::vector<at::Tensor> inputs;
  for (int r = 0; r < n; ++r) inputs.push_back(rank_input(r, numel, 3));
  at::Tensor average = true_average(inputs);

  auto run = [&](bool with_feedback, std::vector<comm::ErrorFeedback>& feedback) {
    at::Tensor total = at::zeros({numel}, at::kDouble);
    FakeWorld::run(n, [&](comm::Communicator& c) {
      auto codec = comm::make_codec(spec);
      for (int t = 0; t < steps; ++t) {
        at::Tensor buffer = inputs[c.rank()].clone();
        comm::compressed_all_reduce(c, buffer, *codec, with_feedback ? &feedback[c.rank()] : nullptr, 1);
        if (c.rank() == 0) total += buffer.to(at::kDouble);
      }
    });
    return total;
  };
  std::vector<comm::ErrorFeedback> feedback(n), unused(n);
  at::Tensor with = run(true, feedback);
  at::Tensor without = run(false, unused);

  at::Tensor held = at::zeros({numel}, at::kDouble);
  for (int r = 0; r < n; ++r) held += feedback[r].residual(1).to(at::kDouble) / n;
  std::vector<at::Tensor> owned;
  for (int r = 0; r < n; ++r) {
    at::Tensor chunk = feedback[r].residual(1, comm::ErrorFeedback::Stage::OwnedAverage);
    if (chunk.defined()) owned.push_back(chunk);
  }
  if (!owned.empty()) held += at::cat(owned).narrow(0, 0, numel).to(at::kDouble);

  at::Tensor expected = average.to(at::kDouble) * steps;
  const double scale = expected.abs().max().item<double>();
  EXPECT_LE((with + held - expected).abs().max().item<double>(), 1e-4 * scale) << spec << " n=" << n;
  const double error_with = (with - expected).norm().item<double>();
  const double error_without = (without - expected).norm().item<double>();
  EXPECT_LT(error_with * gain, error_without) << spec << " n=" << n;
}

TEST(CompressedAllReduceFeedback, ResidualsAccountForEverythingNotYetDelivered) {
  check_feedback_accounting("int4", 3, 2000, 4.0);
  check_feedback_accounting("topk:0.05", 2, 999, 1.5);
  check_feedback_accounting("powersgd:2", 2, 1500, 1.2);
}
