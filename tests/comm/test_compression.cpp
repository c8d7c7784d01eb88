// Gradient codecs on one process: round-trip error bounds, payload sizes, error-feedback accounting, specs.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <string>
#include <vector>

#include "crosstrain/comm/compression/codecs.h"
#include "crosstrain/core/error.h"

using namespace crosstrain;
using comm::Codec;
using comm::ErrorFeedback;
using comm::make_codec;

namespace {

const std::vector<int64_t> kSizes = {0, 1, 2, 7, 255, 256, 257, 1000, 4099};

// Normal values whose magnitude varies by orders of magnitude along the buffer, so blocks get different scales.
at::Tensor gradient_like(int64_t n, uint64_t seed) {
  at::Generator gen = at::detail::createCPUGenerator(seed);
  at::Tensor x = at::randn({n}, gen, at::kFloat);
  at::Tensor magnitude = at::exp(at::randn({n}, gen, at::kFloat).mul_(2));
  return x.mul_(magnitude);
}

float max_abs(const at::Tensor& t) { return t.numel() == 0 ? 0.f : t.abs().max().item<float>(); }

// Largest violation of |x - y| <= bound (elementwise); <= 0 when the bound holds everywhere.
float worst_excess(const at::Tensor& x, const at::Tensor& y, const at::Tensor& bound) {
  if (x.numel() == 0) return 0.f;
  return ((x - y).abs() - bound).max().item<float>();
}

at::Tensor round_trip(Codec& codec, const at::Tensor& x) { return codec.decode(codec.encode(x), x.numel()); }

}  // namespace

TEST(Codecs, NoneIsExact) {
  auto codec = make_codec("none");
  for (int64_t n : kSizes) {
    at::Tensor x = gradient_like(n, 1);
    EXPECT_TRUE(at::equal(round_trip(*codec, x), x)) << n;
  }
}

TEST(Codecs, CastsRoundToNearestWithinTheirUnitRoundoff) {
  // bf16 keeps 8 significant bits, fp16 11: relative error <= 2^-8 and 2^-11 (fp16 subnormals: 2^-25 absolute).
  struct Case { const char* spec; double unit; double absolute; };
  for (Case c : {Case{"bf16", std::ldexp(1.0, -8), 0.0}, Case{"fp16", std::ldexp(1.0, -11), std::ldexp(1.0, -25)}}) {
    auto codec = make_codec(c.spec);
    for (int64_t n : kSizes) {
      at::Tensor x = gradient_like(n, 2).clamp(-60000, 60000);
      at::Tensor y = round_trip(*codec, x);
      ASSERT_EQ(y.scalar_type(), at::kFloat);
      ASSERT_EQ(y.numel(), n);
      EXPECT_LE(worst_excess(x, y, x.abs() * c.unit + c.absolute), 0.f) << c.spec << " n=" << n;
      EXPECT_EQ(codec->encode(x).bytes(), 2 * n);
    }
  }
}

TEST(Codecs, QuantizationErrorIsAtMostHalfTheBlockScale) {
  for (const char* spec : {"int8", "int4"}) {
    auto codec = make_codec(spec);
    auto& q = dynamic_cast<comm::QuantizeCodec&>(*codec);
    for (int64_t n : kSizes) {
      at::Tensor x = gradient_like(n, 3);
      at::Tensor y = round_trip(*codec, x);
      ASSERT_EQ(y.numel(), n);
      // Each element's bound: half its block's scale, plus float32 rounding of the division and the product.
      at::Tensor scale = q.scales(x).repeat_interleave(q.block()).narrow(0, 0, n);
      at::Tensor bound = scale * 0.5 + x.abs() * 1e-6;
      EXPECT_LE(worst_excess(x, y, bound), 0.f) << spec << " n=" << n;
      EXPECT_EQ(codec->encode(x).bytes(), codec->payload_bytes(n)) << spec << " n=" << n;
      // The largest element of each block is representable exactly up to rounding of the scale.
      if (n > 0) EXPECT_NEAR(max_abs(y), max_abs(x), max_abs(x) * 1e-6) << spec;
    }
  }
}

TEST(Codecs, QuantizedPayloadsAreSmall) {
  const int64_t n = 1 << 20;
  auto int8 = make_codec("int8");
  auto int4 = make_codec("int4");
  EXPECT_LE(int8->payload_bytes(n) * 3.5, 4.0 * n);  // 1 byte per element + 4 per 256: 3.94x
  EXPECT_LE(int4->payload_bytes(n) * 7.5, 4.0 * n);  // half a byte per element + 4 per 256: 7.76x
  EXPECT_EQ(int8->payload_bytes(1000), 1000 + 4 * 4);
  EXPECT_EQ(int4->payload_bytes(1001), 501 + 4 * 4);  // two codes per byte, the last byte half used
  at::Tensor x = gradient_like(n, 4);
  EXPECT_EQ(int8->encode(x).bytes(), int8->payload_bytes(n));
  EXPECT_EQ(int4->encode(x).bytes(), int4->payload_bytes(n));
}

TEST(Codecs, QuantizationOfZerosAndExtremes) {
  auto codec = make_codec("int4");
  at::Tensor zeros = at::zeros({300});
  EXPECT_TRUE(at::equal(round_trip(*codec, zeros), zeros));
  // Codes reach both ends of the range.
  at::Tensor ends = at::tensor({-7.f, 7.f, -3.5f, 0.f, 1.f});
  EXPECT_TRUE(at::allclose(round_trip(*codec, ends), at::tensor({-7.f, 7.f, -4.f, 0.f, 1.f})));  // -3.5 ties to even
}

TEST(Codecs, NonFiniteValuesPoisonOnlyTheirBlock) {
  for (const char* spec : {"int8", "int4"}) {
    auto codec = make_codec(spec);
    at::Tensor x = gradient_like(600, 5);
    x[300] = std::numeric_limits<float>::infinity();
    at::Tensor y = round_trip(*codec, x);
    EXPECT_TRUE(at::isnan(y.narrow(0, 256, 256)).all().item<bool>()) << spec;
    EXPECT_TRUE(at::isfinite(y.narrow(0, 0, 256)).all().item<bool>()) << spec;
    EXPECT_TRUE(at::isfinite(y.narrow(0, 512, 88)).all().item<bool>()) << spec;
  }
}

TEST(Codecs, TopKKeepsExactlyCeilFractionTimesN) {
  comm::TopKCodec seven(0.07);
  EXPECT_EQ(seven.kept(100), 7);  // 0.07 * 100 is 7.000000000000001 in double
  comm::TopKCodec one_percent(0.01);
  EXPECT_EQ(one_percent.kept(0), 0);
  EXPECT_EQ(one_percent.kept(1), 1);
  EXPECT_EQ(one_percent.kept(1000), 10);
  EXPECT_EQ(one_percent.kept(1001), 11);
  EXPECT_EQ(comm::TopKCodec(1.0).kept(5), 5);
  for (double f : {0.01, 0.1, 0.5, 1.0}) {
    comm::TopKCodec codec(f);
    for (int64_t n : kSizes) {
      at::Tensor x = gradient_like(n, 6);
      const int64_t k = static_cast<int64_t>(std::ceil(f * n - 1e-9));
      ASSERT_EQ(codec.kept(n), k) << f << " " << n;
      auto payload = codec.encode(x);
      EXPECT_EQ(payload.parts[0].numel(), k);
      EXPECT_EQ(payload.bytes(), codec.payload_bytes(n));
      at::Tensor y = codec.decode(payload, n);
      at::Tensor kept = y.ne(0);
      EXPECT_EQ(kept.sum().item<int64_t>(), k);
      // Kept entries are exact; every dropped entry is no larger than the smallest kept one.
      EXPECT_TRUE(at::equal(y.masked_select(kept), x.masked_select(kept)));
      if (k > 0 && k < n)
        EXPECT_LE(max_abs(x.masked_select(kept.logical_not())), x.masked_select(kept).abs().min().item<float>());
      // Indices ascend, so a payload is canonical.
      if (k > 1) EXPECT_TRUE(payload.parts[0].diff().gt(0).all().item<bool>());
    }
  }
}

TEST(Codecs, PowerSgdReproducesLowRankBuffers) {
  comm::PowerSgdCodec codec(4);
  auto [rows, cols] = comm::PowerSgdCodec::shape(1000);
  EXPECT_EQ(rows, 32);
  EXPECT_EQ(cols, 32);
  EXPECT_EQ(comm::PowerSgdCodec::shape(1001), (std::pair<int64_t, int64_t>{32, 32}));
  EXPECT_EQ(comm::PowerSgdCodec::shape(1025), (std::pair<int64_t, int64_t>{33, 32}));
  // A rank-3 matrix: one power step with a random Q spans its column space.
  at::Generator gen = at::detail::createCPUGenerator(7);
  at::Tensor m = at::mm(at::randn({40, 3}, gen, at::kFloat), at::randn({3, 40}, gen, at::kFloat));
  at::Tensor x = m.reshape({-1});
  at::Tensor y = round_trip(codec, x);
  EXPECT_LE((y - x).norm().item<float>(), 1e-4 * x.norm().item<float>());
}

TEST(Codecs, PowerSgdIsAProjectionAndItsWarmStartConverges) {
  comm::PowerSgdCodec codec(2);
  for (int64_t n : kSizes) {
    at::Tensor x = gradient_like(n, 8);
    at::Tensor y = codec.decode(codec.encode(x, /*buffer_id=*/n), n);
    ASSERT_EQ(y.numel(), n);
    if (n > 0) EXPECT_LE((x - y).norm().item<float>(), x.norm().item<float>() * (1 + 1e-5)) << n;
  }
  // A 48x48 matrix with a decaying spectrum: repeated steps reach the best rank-2 error (Eckart-Young).
  at::Generator gen = at::detail::createCPUGenerator(9);
  auto u = std::get<0>(at::linalg_qr(at::randn({48, 48}, gen, at::kFloat)));
  auto v = std::get<0>(at::linalg_qr(at::randn({48, 48}, gen, at::kFloat)));
  at::Tensor sigma = at::pow(at::full({48}, 0.7f), at::arange(48, at::kFloat));
  at::Tensor x = at::mm(u * sigma, v.t()).reshape({-1}).contiguous();
  const float best = sigma.narrow(0, 2, 46).square().sum().sqrt().item<float>();
  float first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    float err = (x - codec.decode(codec.encode(x, 99), x.numel())).norm().item<float>();
    if (step == 0) first = err;
    last = err;
  }
  EXPECT_LE(last, best * 1.01f) << "first step " << first << ", best " << best;
  EXPECT_GE(last, best * 0.99f);
}

TEST(Codecs, PowerSgdPayloadOfAMillionElementsIsTiny) {
  auto codec = make_codec("powersgd:4");
  const int64_t n = 1 << 20;  // a 1024 x 1024 matrix: P and Q are 1024 x 4 each
  EXPECT_EQ(codec->payload_bytes(n), 2 * 4 * 1024 * 4);
  EXPECT_GE(4.0 * n / codec->payload_bytes(n), 20.0);
}

TEST(Codecs, PowerSgdStartsAlikeOnEveryInstance) {
  // Two ranks' codecs, built alike, draw the same first Q for the same buffer id.
  comm::PowerSgdCodec a(4), b(4);
  at::Tensor x = gradient_like(5000, 10);
  auto pa = a.encode(x, 3), pb = b.encode(x, 3);
  EXPECT_TRUE(at::equal(pa.parts[0], pb.parts[0]));
  EXPECT_TRUE(at::equal(pa.parts[1], pb.parts[1]));
}

TEST(ErrorFeedback, ResidualPlusSentEqualsInputAtEveryStep) {
  for (const char* spec : {"none", "bf16", "fp16", "int8", "int4", "topk:0.05", "powersgd:2"}) {
    auto codec = make_codec(spec);
    const bool exact = std::string(spec).rfind("powersgd", 0) != 0;
    ErrorFeedback feedback;
    const int64_t n = 1237;
    at::Tensor total_input = at::zeros({n}, at::kDouble), total_sent = at::zeros({n}, at::kDouble);
    for (int step = 0; step < 6; ++step) {
      at::Tensor x = gradient_like(n, 100 + step);
      at::Tensor before = feedback.residual(7);
      at::Tensor corrected = before.defined() ? x + before : x.clone();
      auto payload = feedback.encode(*codec, x, 7);
      at::Tensor sent = codec->decode(payload, n);
      at::Tensor after = feedback.residual(7);
      ASSERT_TRUE(after.defined());
      // The accounting of one step: residual + sent == input + previous residual.
      if (exact) EXPECT_TRUE(at::equal(after + sent, corrected)) << spec << " step " << step;
      else EXPECT_TRUE(at::allclose(after + sent, corrected, 1e-5, 1e-5)) << spec << " step " << step;
      total_input += x.to(at::kDouble);
      total_sent += sent.to(at::kDouble);
    }
    // Over the steps: everything sent plus the last residual is everything that came in.
    at::Tensor balance = total_sent + feedback.residual(7).to(at::kDouble) - total_input;
    EXPECT_LE(balance.abs().max().item<double>(), 1e-4 * total_input.abs().max().item<double>()) << spec;
  }
}

TEST(ErrorFeedback, ResidualsAreKeptPerBufferAndChecked) {
  auto codec = make_codec("int8");
  ErrorFeedback feedback;
  feedback.encode(*codec, gradient_like(300, 1), 0);
  feedback.encode(*codec, gradient_like(500, 2), 1);
  EXPECT_EQ(feedback.residual(0).numel(), 300);
  EXPECT_EQ(feedback.residual(1).numel(), 500);
  EXPECT_FALSE(feedback.residual(2).defined());
  EXPECT_FALSE(feedback.residual(0, ErrorFeedback::Stage::OwnedAverage).defined());
  try {
    feedback.encode(*codec, gradient_like(301, 3), 0);
    FAIL() << "expected a UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("buffer 0 had 300 elements and now has 301"), std::string::npos) << e.what();
  }
  feedback.reset();
  EXPECT_FALSE(feedback.residual(0).defined());
}

TEST(CodecSpecs, ValidSpecsRoundTripTheirNames) {
  for (const char* spec : {"none", "bf16", "fp16", "int8", "int4", "topk:0.01", "topk:1", "powersgd:4", "powersgd:1"})
    EXPECT_EQ(make_codec(spec)->name(), spec);
  EXPECT_EQ(make_codec("topk:1e-3")->name(), "topk:0.001");
}

TEST(CodecSpecs, BadSpecsListTheValidForms) {
  for (const char* spec : {"", "int16", "BF16", "topk", "topk:", "topk:0", "topk:1.5", "topk:-0.1", "topk:0.1x",
                           "topk:nan", "powersgd", "powersgd:0", "powersgd:-1", "powersgd:2.5", "powersgd:x",
                           "int8:4", "none:1"}) {
    try {
      make_codec(spec);
      ADD_FAILURE() << "'" << spec << "' was accepted";
    } catch (const UsageError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("'" + std::string(spec) + "'"), std::string::npos) << what;
      EXPECT_NE(what.find("none, bf16, fp16, int8, int4, topk:F"), std::string::npos) << what;
      EXPECT_NE(what.find("powersgd:R"), std::string::npos) << what;
    }
  }
}

TEST(Codecs, RejectWhatIsNotContiguousFloat32) {
  auto codec = make_codec("int8");
  EXPECT_THROW(codec->encode(at::ones({4}, at::kDouble)), UsageError);
  EXPECT_THROW(codec->encode(at::ones({4, 4}).t()), UsageError);
  EXPECT_NO_THROW(codec->encode(at::ones({4, 4})));  // any contiguous shape reads as flat
}
