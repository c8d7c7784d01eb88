// The planner's formulas against hand-computed cases (issue 16): parameter and FLOP counts of the presets, the
// ZeRO and activation memory accounting, the step time's compute, bubble, tensor-, data-parallel and wide-area
// parts, the speed-balanced stage split across clusters, and the layout words. Every expected number is derived
// in a comment from the published formula, not read off the code's output.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "crosstrain/core/error.h"
#include "crosstrain/planner/cluster.h"
#include "crosstrain/planner/estimate.h"
#include "crosstrain/planner/layout.h"
#include "crosstrain/planner/model_shape.h"

namespace crosstrain::planner {
namespace {

// Relative closeness for quantities that are sums of a few floating-point products.
void expect_rel(double actual, double expected, double rel = 1e-9) {
  EXPECT_NEAR(actual, expected, std::fabs(expected) * rel) << "expected " << expected << ", got " << actual;
}

ModelShape gpt_shape(int64_t layers, int64_t hidden, int64_t heads, int64_t seq, int64_t vocab) {
  ModelShape m;
  m.name = "hand";
  m.arch = models::ModelArch::Gpt;
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.seq = seq;
  m.vocab = vocab;
  return m;
}

// One host of `devices` devices of type x: `tflops` bf16 peak sustained at efficiency 0.5 (no GEMM curve), no
// memory-bandwidth or per-operator cost, so the only compute time is FLOPs / (peak x 0.5).
std::string one_host_file(int devices, double host_gbps = 100, double memory_gb = 80) {
  return "name = \"hand\"\n"
         "[devices.x]\n"
         "peak_tflops = { bf16 = 100 }\n"
         "memory_gb = " + std::to_string(memory_gb) + "\n"
         "gemm_efficiency = 0.5\n"
         "[[clusters]]\n"
         "name = \"only\"\n"
         "device = \"x\"\n"
         "hosts = 1\n"
         "devices_per_host = " + std::to_string(devices) + "\n"
         "[clusters.links.host]\n"
         "latency_us = 1\n"
         "bandwidth_gbps = " + std::to_string(host_gbps) + "\n";
}

constexpr double kRate = 100e12 * 0.5;  // FLOP/s of one_host_file's device on every product

Layout layout_of(int dp, int tp, int pp, int m, int mb = 1) {
  Layout l;
  l.dp = dp, l.tp = tp, l.pp = pp, l.microbatches = m, l.micro_batch = mb;
  return l;
}

// ---------------------------------------------------------------------------------------------------------------
// ModelShape

TEST(PlannerModelShape, Gpt2ParametersWithTiedEmbeddings) {
  // 12 L h^2 + 13 L h + V h + s h + 2h with L = 12, h = 768, V = 50257, s = 1024:
  //   12 h^2 = 12 x 589,824 = 7,077,888; 13 h = 9,984; one block 7,087,872; 12 blocks 85,054,464
  //   V h = 38,597,376; s h = 786,432; final LayerNorm 2h = 1,536
  //   total 85,054,464 + 38,597,376 + 786,432 + 1,536 = 124,439,808 (the head is the embedding: no V h more).
  const ModelShape m = model_preset("gpt2");
  EXPECT_TRUE(m.tied_embeddings);
  EXPECT_DOUBLE_EQ(m.block_parameters(), 7087872.0);
  EXPECT_DOUBLE_EQ(m.head_parameters(), 0.0);
  EXPECT_DOUBLE_EQ(m.parameters(), 124439808.0);
}

// A recipe's model is planned with the trainer's own parameter count, for either family.
TEST(PlannerModelShape, RecipeModelsCountTheTrainersParameters) {
  models::GPTConfig c;
  c.n_layer = 3, c.n_head = 4, c.n_embd = 64, c.vocab_size = 512;
  EXPECT_DOUBLE_EQ(from_gpt_config(c, "gpt").parameters(), static_cast<double>(c.parameter_count()));
  c.arch = models::ModelArch::Llama;
  c.n_kv_head = 2;
  for (bool tied : {false, true}) {
    c.tie_embeddings = tied;
    const ModelShape m = from_gpt_config(c, "llama");
    EXPECT_EQ(m.arch, models::ModelArch::Llama);
    EXPECT_DOUBLE_EQ(m.parameters(), static_cast<double>(c.parameter_count())) << "tied " << tied;
  }
}

TEST(PlannerModelShape, LlamaParameters) {
  // llama-7b: L = 32, h = 4096, f = 11008, V = 32000, no biases, RMSNorm (h weights), untied head.
  //   attention 4 h^2 = 67,108,864; SwiGLU 3 h f = 135,266,304; two norms 8,192: block 202,383,360
  //   32 blocks 6,476,267,520 + embedding 131,072,000 + head 131,072,000 + final norm 4,096 = 6,738,415,616.
  EXPECT_DOUBLE_EQ(model_preset("llama-7b").parameters(), 6738415616.0);
  // llama-70b: L = 80, h = 8192, 64 heads of 128, 8 kv heads (k and v 1024 wide), f = 28672.
  //   attention 2 h^2 + 2 h (8 x 128) = 134,217,728 + 16,777,216 = 150,994,944
  //   SwiGLU 3 x 8192 x 28672 = 704,643,072; norms 16,384: block 855,654,400; 80 blocks 68,452,352,000
  //   + embedding and head 2 x 32000 x 8192 = 524,288,000 + final norm 8,192 = 68,976,648,192.
  const ModelShape l70 = model_preset("llama-70b");
  EXPECT_EQ(l70.kv_heads_or_heads(), 8);
  EXPECT_DOUBLE_EQ(l70.parameters(), 68976648192.0);
}

TEST(PlannerModelShape, Gpt3Parameters) {
  // L = 96, h = 12288, V = 51200 (Megatron's padded vocabulary), s = 2048, tied:
  //   12 h^2 = 1,811,939,328; 13 h = 159,744: block 1,812,099,072; 96 blocks 173,961,510,912
  //   V h = 629,145,600; s h = 25,165,824; 2h = 24,576: total 174,615,846,912 (the paper's 175B, 174.6e9).
  EXPECT_DOUBLE_EQ(model_preset("gpt3-175b").parameters(), 174615846912.0);
}

TEST(PlannerModelShape, FlopsPerTokenIsSixMatmulParametersPlusAttention) {
  // gpt2: N_matmul = L 12 h^2 + V h (biases and norms multiply nothing; the tied head still multiplies)
  //   = 12 x 7,077,888 + 38,597,376 = 123,532,032; 6 N = 741,192,192
  //   attention 12 L s h = 12 x 12 x 1024 x 768 = 113,246,208: total 854,438,400.
  const ModelShape m = model_preset("gpt2");
  EXPECT_DOUBLE_EQ(m.matmul_parameters(), 123532032.0);
  EXPECT_DOUBLE_EQ(m.flops_per_token(), 854438400.0);
  EXPECT_DOUBLE_EQ(m.hardware_flops_per_token(false), m.flops_per_token());
}

TEST(PlannerModelShape, RecomputeFlopsEqualMegatronsFormula) {
  // Megatron (Narayanan et al. 2021, eq. 3) per token with full recompute, no biases counted:
  //   96 l h^2 (1 + s/(6h) + V/(16 l h)) = 96 l h^2 + 16 l s h + 6 V h.
  // Ours: 6 (12 l h^2 + V h) + 12 l s h, plus the recomputed forward 2 x 12 l h^2 + 4 l s h
  //   = 96 l h^2 + 16 l s h + 6 V h: the same terms. Biases are not matmul parameters, so no tolerance is needed
  //   beyond rounding (the bias terms, 13 l h per token, would be < 1e-3 relative for GPT-3).
  for (const char* name : {"gpt2", "gpt2-xl", "gpt3-175b"}) {
    const ModelShape m = model_preset(name);
    const double l = m.layers, h = m.hidden, s = m.seq, V = m.vocab;
    const double megatron = 96 * l * h * h * (1 + s / (6 * h) + V / (16 * l * h));
    expect_rel(m.hardware_flops_per_token(true), megatron, 1e-12);
  }
  // GPT-3 175B by hand: 96 x 96 x 12288^2 = 1.391569e12; 1 + 2048/73728 + 51200/18874368 = 1.0304905;
  // 1.434e12 FLOPs per token (Megatron's 138 TFLOP/s per GPU at 1536 x 2048 tokens per step).
  expect_rel(model_preset("gpt3-175b").hardware_flops_per_token(true), 1.43400e12, 1e-4);
}

TEST(PlannerModelShape, TrainingFlopsAreSixNd) {
  // 6 x 174,615,846,912 x 300e9 = 3.1430852e23 (the 314 ZFLOP of the GPT-3 paper); 8 N D with recompute.
  const ModelShape m = model_preset("gpt3-175b");
  expect_rel(m.training_flops(300e9), 3.14308524e23, 1e-8);
  expect_rel(m.training_flops_recompute(300e9), 4.19078032e23, 1e-8);
}

TEST(PlannerModelShape, ValidateNamesTheField) {
  auto message = [](const ModelShape& m) -> std::string {
    try {
      m.validate();
    } catch (const UsageError& e) {
      return e.what();
    }
    return "";
  };
  ModelShape m = gpt_shape(2, 100, 3, 16, 32);  // 100 % 3 != 0
  EXPECT_NE(message(m).find("hidden (100) must be a multiple of heads (3)"), std::string::npos) << message(m);
  m = gpt_shape(2, 96, 6, 16, 32);
  m.kv_heads = 4;  // 6 % 4 != 0
  EXPECT_NE(message(m).find("kv_heads"), std::string::npos) << message(m);
  m = gpt_shape(0, 96, 6, 16, 32);
  EXPECT_NE(message(m).find("positive"), std::string::npos) << message(m);
  m = gpt_shape(2, 96, 6, 16, 32);
  m.arch = models::ModelArch::Dlrm;  // a family the trainer runs, but not a decoder the planner models
  EXPECT_NE(message(m).find("'dlrm'"), std::string::npos) << message(m);
  m.arch = models::ModelArch::Llama;
  EXPECT_EQ(message(m), "");
  EXPECT_THROW(model_preset("gpt-5"), UsageError);
}

// ---------------------------------------------------------------------------------------------------------------
// Memory

// gpt-tiny: L = 4, h = 128, 4 heads, s = 128, V = 256, untied. Parameters by hand:
//   block 12 h^2 + 13 h = 196,608 + 1,664 = 198,272; 4 blocks 793,088
//   embedding V h + s h = 32,768 + 16,384 = 49,152; head V h = 32,768; final LayerNorm 2h = 256
//   total 875,264 (one stage holds them all).
constexpr double kTinyParams = 875264;
constexpr double kTinyBlock = 198272;
// Korthikanti et al.: 34 s b h bytes per layer at 16 bits, b = 1: 34 x 128 x 128 = 557,056.
constexpr double kTinyLayerActivations = 557056;
// Buffers: the last stage's fp32 logits and their gradient 2 x (s b) x V x 4 = 262,144; 2 x 25 MB buckets.
constexpr double kTinyLogits = 262144, kBuckets = 50e6;

TEST(PlannerMemory, ZeroStagesShardOptimizerThenGradientsThenParameters) {
  const ModelShape m = model_preset("gpt-tiny");
  ASSERT_EQ(m.layers, 4);
  ASSERT_EQ(m.hidden, 128);
  ASSERT_EQ(m.vocab, 256);
  ASSERT_EQ(m.seq, 128);
  ASSERT_DOUBLE_EQ(m.parameters(), kTinyParams);
  const ClusterFile c = parse_cluster(one_host_file(4), "memory.toml");
  const double P = kTinyParams, dp = 4;
  // Mixed precision (ZeRO paper): bf16 parameters 2P, bf16 gradients 2P, fp32 master + two moments 12P.
  struct Expected {
    int zero;
    double params, grads, optimizer;
  };
  for (const Expected& x : {Expected{0, 2 * P, 2 * P, 12 * P}, Expected{1, 2 * P, 2 * P, 12 * P / dp},
                            Expected{2, 2 * P, 2 * P / dp, 12 * P / dp}, Expected{3, 2 * P / dp, 2 * P / dp, 12 * P / dp}}) {
    Layout l = layout_of(4, 1, 1, 1);
    l.zero = x.zero;
    const MemoryBreakdown mem = estimate_memory(m, c, l);
    SCOPED_TRACE("zero=" + std::to_string(x.zero));
    EXPECT_DOUBLE_EQ(mem.parameters_bytes, x.params);
    EXPECT_DOUBLE_EQ(mem.gradients_bytes, x.grads);
    EXPECT_DOUBLE_EQ(mem.optimizer_bytes, x.optimizer);
    // ZeRO-3 also holds two gathered blocks in bf16: 2 x 198,272 x 2 bytes = 793,088.
    EXPECT_DOUBLE_EQ(mem.buffers_bytes, kTinyLogits + kBuckets + (x.zero == 3 ? 4 * kTinyBlock : 0));
  }
  // fp32 training: 4 + 4 + 8 bytes a parameter.
  Layout l = layout_of(4, 1, 1, 1);
  l.precision = "fp32";
  const MemoryBreakdown mem = estimate_memory(m, c, l);
  EXPECT_DOUBLE_EQ(mem.parameters_bytes, 4 * P);
  EXPECT_DOUBLE_EQ(mem.gradients_bytes, 4 * P);
  EXPECT_DOUBLE_EQ(mem.optimizer_bytes, 8 * P);
}

TEST(PlannerMemory, ActivationsFollowKorthikanti) {
  const ModelShape m = model_preset("gpt-tiny");
  const ClusterFile c = parse_cluster(one_host_file(4), "memory.toml");
  // One stage, 1F1B with p = 1: one micro-batch in flight; 4 layers x 34 s b h = 2,228,224 bytes.
  MemoryBreakdown mem = estimate_memory(m, c, layout_of(1, 1, 1, 4));
  EXPECT_EQ(mem.in_flight_microbatches, 1);
  EXPECT_DOUBLE_EQ(mem.activations_bytes, 4 * kTinyLayerActivations);
  // b = 2 sequences per micro-batch: twice that.
  EXPECT_DOUBLE_EQ(estimate_memory(m, c, layout_of(1, 1, 1, 4, 2)).activations_bytes, 8 * kTinyLayerActivations);
  // The total is the sum of its parts: 2P + 2P + 12P = 14,004,224, + 2,228,224 + 262,144 + 50e6 = 66,494,592.
  EXPECT_DOUBLE_EQ(mem.total_bytes, 66494592.0);

  // Tensor parallelism without sequence parallelism: s b h (10 + 24 / t) per layer; t = 2: 22 s b h.
  const double sbh = 128.0 * 128.0;
  mem = estimate_memory(m, c, layout_of(1, 2, 1, 4));
  EXPECT_DOUBLE_EQ(mem.activations_bytes, 4 * 22 * sbh);
  // With sequence parallelism: 34 s b h / t = 17 s b h.
  Layout sp = layout_of(1, 2, 1, 4);
  sp.sequence_parallel = true;
  EXPECT_DOUBLE_EQ(estimate_memory(m, c, sp).activations_bytes, 4 * 17 * sbh);
  // fp32 activations: twice the 16-bit bytes.
  Layout fp32 = layout_of(1, 1, 1, 4);
  fp32.precision = "fp32";
  EXPECT_DOUBLE_EQ(estimate_memory(m, c, fp32).activations_bytes, 8 * kTinyLayerActivations);

  // Full recompute keeps each layer's input, 2 s b h, plus one block's full working set while it is recomputed
  // (34 s b h): (4 x 2 + 34) s b h = 42 x 16,384 = 688,128. The report keeps the no-recompute figure.
  Layout full = layout_of(1, 1, 1, 4);
  full.recompute = "full";
  mem = estimate_memory(m, c, full);
  EXPECT_DOUBLE_EQ(mem.activations_bytes, 42 * sbh);
  EXPECT_DOUBLE_EQ(mem.activations_no_recompute_bytes, 4 * kTinyLayerActivations);
  // With sequence parallelism (t = 2) the kept inputs shrink by t: (4 x 2 / 2 + 34 / 2) s b h = 21 s b h.
  full.tp = 2;
  full.sequence_parallel = true;
  EXPECT_DOUBLE_EQ(estimate_memory(m, c, full).activations_bytes, 21 * sbh);
}

TEST(PlannerMemory, OneFOneBHoldsPMicroBatchesOnTheFirstRank) {
  const ModelShape m = model_preset("gpt-tiny");
  const ClusterFile c = parse_cluster(one_host_file(4), "memory.toml");
  // pp = 2, m = 4, stages 2 + 2. Rank 0: 2 blocks + embedding = 445,696 parameters (16 bytes each: 7,131,136),
  // min(m, p - 0) = 2 micro-batches x 2 layers x 557,056 = 2,228,224 activations, buckets: 59,359,360 bytes.
  // Rank 1: 2 blocks + head + final norm = 429,568 (6,873,088), 1 x 2 x 557,056 = 1,114,112, logits and
  // buckets: 58,249,344. Rank 0 is the most loaded and is the one reported.
  Layout l = layout_of(1, 1, 2, 4);
  l.stage_layers = {2, 2};
  MemoryBreakdown mem = estimate_memory(m, c, l);
  EXPECT_EQ(mem.in_flight_microbatches, 2);
  EXPECT_DOUBLE_EQ(mem.parameters_bytes, 2 * 445696.0);
  EXPECT_DOUBLE_EQ(mem.activations_bytes, 2 * 2 * kTinyLayerActivations);
  EXPECT_DOUBLE_EQ(mem.total_bytes, 59359360.0);
  // pp = 4, m = 8, one block a stage: rank 0 holds p = 4 micro-batches of one layer.
  l = layout_of(1, 1, 4, 8);
  l.stage_layers = {1, 1, 1, 1};
  mem = estimate_memory(m, c, l);
  EXPECT_EQ(mem.in_flight_microbatches, 4);
  EXPECT_DOUBLE_EQ(mem.activations_bytes, 4 * kTinyLayerActivations);
}

TEST(PlannerMemory, FitsFlipsAtTheDeviceMemory) {
  const ModelShape m = model_preset("gpt-tiny");
  ClusterFile c = parse_cluster(one_host_file(1), "memory.toml");
  const Layout l = layout_of(1, 1, 1, 4);
  const double total = 66494592.0;  // derived in ActivationsFollowKorthikanti
  c.devices.at("x").memory_bytes = total;
  MemoryBreakdown mem = estimate_memory(m, c, l);
  EXPECT_TRUE(mem.fits);
  EXPECT_DOUBLE_EQ(mem.capacity_bytes, total);
  c.devices.at("x").memory_bytes = total - 1;
  EXPECT_FALSE(estimate_memory(m, c, l).fits);
  const Estimate e = estimate(m, c, l);
  EXPECT_FALSE(e.feasible);
  EXPECT_EQ(e.wall, "memory");
  EXPECT_NE(e.infeasible_reason.find("66 MB"), std::string::npos) << e.infeasible_reason;
}

// ---------------------------------------------------------------------------------------------------------------
// Time

TEST(PlannerTime, OneRankComputeIsHardwareFlopsOverSustainedRate) {
  // gpt-tiny, one device, m = 2 micro-batches of one sequence: 256 tokens a step.
  // A block's products per token: forward 24 h^2 (qkv 6h^2, out 2h^2, MLP 16h^2) + 4 s h (scores and mix);
  // backward twice the products (input and weight gradients) and twice the attention core (input only):
  // 3 x 24 h^2 + 3 x 4 s h. The head 2 h V, three times. Per token:
  //   72 L h^2 + 12 L s h + 6 V h = 4,718,592 + 786,432 + 196,608 = 5,701,632 (= 6 N_matmul + 12 L s h).
  // 256 x 5,701,632 = 1,459,617,792 FLOPs at 100e12 x 0.5: 2.919235584e-5 s.
  const ModelShape m = model_preset("gpt-tiny");
  const ClusterFile c = parse_cluster(one_host_file(1), "time.toml");
  Estimate e = estimate(m, c, layout_of(1, 1, 1, 2));
  expect_rel(e.time.compute_s, 1459617792.0 / kRate);
  EXPECT_DOUBLE_EQ(e.time.tp_exposed_s, 0.0);
  EXPECT_DOUBLE_EQ(e.time.pp_bubble_s, 0.0);
  EXPECT_DOUBLE_EQ(e.time.dp_exposed_s, 0.0);
  EXPECT_DOUBLE_EQ(e.hardware_flops_per_step, 1459617792.0);
  // Full recompute adds one forward of every block: 24 L h^2 + 4 L s h = 1,835,008 per token, 7,536,640 in all;
  // x 256 = 1,929,379,840 FLOPs.
  Layout full = layout_of(1, 1, 1, 2);
  full.recompute = "full";
  e = estimate(m, c, full);
  expect_rel(e.time.compute_s, 1929379840.0 / kRate);
  EXPECT_DOUBLE_EQ(e.hardware_flops_per_step, 1929379840.0);
}

TEST(PlannerTime, StepIsComputeAloneOnOneRankWithoutMemoryCosts) {
  // The device has memory_bandwidth 0, which cluster.h documents as "element-wise work is free", and no
  // per-operator overhead: one rank's step is its compute and nothing else.
  // EXPECTED TO FAIL while estimate.cpp's fill_sync_and_optimizer divides the optimizer's bytes by
  // max(memory_bandwidth_Bps, 1.0), i.e. 1 byte/s: 875,264 x 38 bytes = 33 million seconds of optimizer.
  const ModelShape m = model_preset("gpt-tiny");
  const ClusterFile c = parse_cluster(one_host_file(1), "time.toml");
  const Estimate e = estimate(m, c, layout_of(1, 1, 1, 2));
  EXPECT_DOUBLE_EQ(e.time.optimizer_s, 0.0);
  expect_rel(e.time.step_s, e.time.compute_s);
}

TEST(PlannerTime, TensorParallelHalvesComputeAndAddsCollectives) {
  const ModelShape m = model_preset("gpt-tiny");
  const ClusterFile c = parse_cluster(one_host_file(2), "time.toml");
  const Estimate one = estimate(m, c, layout_of(1, 1, 1, 2));
  const Estimate two = estimate(m, c, layout_of(1, 2, 1, 2));
  // Every product is split over t = 2 ranks (column- and row-parallel, heads and vocabulary sharded).
  expect_rel(two.time.compute_s, one.time.compute_s / 2);
  EXPECT_GT(two.time.tp_exposed_s, 0.0);
  // A slower host link costs more exposed collective time.
  const ClusterFile slow = parse_cluster(one_host_file(2, 1), "time.toml");
  EXPECT_GT(estimate(m, slow, layout_of(1, 2, 1, 2)).time.tp_exposed_s, two.time.tp_exposed_s);
}

TEST(PlannerTime, DataParallelOnASlowLinkAddsSyncTime) {
  const ModelShape m = model_preset("gpt-tiny");
  const ClusterFile fast = parse_cluster(one_host_file(2, 1000), "time.toml");
  const ClusterFile slow = parse_cluster(one_host_file(2, 0.01), "time.toml");
  const Estimate a = estimate(m, fast, layout_of(2, 1, 1, 2));
  const Estimate b = estimate(m, slow, layout_of(2, 1, 1, 2));
  // 875,264 fp32 gradients = 3.5 MB over 10 Mbit/s: seconds, far longer than the backward hides.
  EXPECT_GT(b.time.dp_exposed_s, 1.0);
  EXPECT_GT(b.time.dp_exposed_s, a.time.dp_exposed_s);
  // Each replica does the one-rank work: the compute does not change with dp.
  expect_rel(b.time.compute_s, a.time.compute_s);
}

// A GPT whose head costs exactly one block, forward and backward: the head's forward 2 h V equals a block's
// 24 h^2 + 4 s h when V = 12 h + 2 s (h = s = 128: V = 1792); its backward (input 2 h V, weight 2 h V) equals the
// block's (24 h^2 + 8 s h) + 24 h^2 since 4 h V = 48 h^2 + 8 s h. With 7 blocks, stages {4, 3 + head} are equal.
ModelShape head_as_block_model() { return gpt_shape(7, 128, 4, 128, 12 * 128 + 2 * 128); }

TEST(PlannerTime, OneFOneBBubbleIsPMinusOneStagesOfWork) {
  const ModelShape m = head_as_block_model();
  const ClusterFile c = parse_cluster(one_host_file(4), "time.toml");
  // p = 2, m = 4: bubble (p - 1)(F + B) and compute m (F + B): bubble = compute x (p - 1) / m = compute / 4.
  Layout l = layout_of(1, 1, 2, 4);
  l.stage_layers = {4, 3};
  Estimate e = estimate(m, c, l);
  expect_rel(e.time.pp_bubble_s, e.time.compute_s * 1 / 4);
  // One stage of work on one micro-batch: 4 block-equivalents of 3 x (24 h^2 + 4 s h) x s FLOPs each:
  // 3 x 458,752 x 128 = 176,160,768 per block; 704,643,072 per stage.
  expect_rel(e.time.pp_bubble_s, 704643072.0 / kRate);
  // p = 4, m = 8, stages {2, 2, 2, 1 + head}: bubble = compute x 3 / 8.
  l = layout_of(1, 1, 4, 8);
  l.stage_layers = {2, 2, 2, 1};
  e = estimate(m, c, l);
  expect_rel(e.time.pp_bubble_s, e.time.compute_s * 3 / 8);
}

TEST(PlannerTime, ZeroBubbleAndInterleavingShrinkTheBubble) {
  const ModelShape m = head_as_block_model();
  const ClusterFile c = parse_cluster(one_host_file(2), "time.toml");
  Layout l = layout_of(1, 1, 2, 4);
  l.stage_layers = {4, 3};
  const Estimate one_f_one_b = estimate(m, c, l);
  // ZB-H2 idles only for the other rank's forward: F = (24 h^2 + 4 s h) out of F + B = 3 (24 h^2 + 4 s h)
  // per block (and per head): a third of 1F1B's bubble.
  l.schedule = parallel::ScheduleKind::ZeroBubbleH2;
  const Estimate zb2 = estimate(m, c, l);
  EXPECT_LT(zb2.time.pp_bubble_s, one_f_one_b.time.pp_bubble_s);
  expect_rel(zb2.time.pp_bubble_s, one_f_one_b.time.pp_bubble_s / 3);
  // Interleaved with v = 2 chunks, stages {2, 2, 2, 1 + head}: rank 0 holds 2 + 2, rank 1 2 + 1 + head = 4
  // block-equivalents, as in 1F1B; the bubble (p - 1)(F + B) / v is half.
  Layout inter = layout_of(1, 1, 2, 4);
  inter.schedule = parallel::ScheduleKind::Interleaved1F1B;
  inter.chunks = 2;
  inter.stage_layers = {2, 2, 2, 1};
  const Estimate v2 = estimate(m, c, inter);
  expect_rel(v2.time.compute_s, one_f_one_b.time.compute_s);
  expect_rel(v2.time.pp_bubble_s, one_f_one_b.time.pp_bubble_s / 2);
}

// Two clusters of one host of two x devices, joined by a slow wide-area link.
std::string two_cluster_file(double wan_gbps) {
  std::string s = "name = \"two\"\n[devices.x]\npeak_tflops = { bf16 = 100 }\nmemory_gb = 80\ngemm_efficiency = 0.5\n"
                  "memory_bandwidth_gbs = 1000\n";
  for (const char* name : {"east", "west"})
    s += std::string("[[clusters]]\nname = \"") + name +
         "\"\ndevice = \"x\"\nhosts = 1\ndevices_per_host = 2\n"
         "[clusters.links.host]\nlatency_us = 1\nbandwidth_gbps = 100\n";
  s += "[links.wan]\nlatency_us = 20000\nbandwidth_gbps = " + std::to_string(wan_gbps) + "\n";
  return s;
}

TEST(PlannerTime, DilocoAmortisesTheWideAreaExchange) {
  const ModelShape m = model_preset("gpt-tiny");
  const ClusterFile c = parse_cluster(two_cluster_file(0.01), "wan.toml");
  Layout l = layout_of(4, 1, 1, 2);
  const Estimate flat = estimate(m, c, l);
  // Flat sync: one all-reduce over 4 ranks whose slowest link is the WAN (3.5 MB at 10 Mbit/s: seconds), all in
  // dp time; nothing is amortised.
  EXPECT_DOUBLE_EQ(flat.time.wan_exposed_s, 0.0);
  EXPECT_GT(flat.time.dp_exposed_s, 1.0);
  l.sync = LayoutSync::DiLoCo;
  l.inner_steps = 10;
  const Estimate h10 = estimate(m, c, l);
  l.inner_steps = 100;
  const Estimate h100 = estimate(m, c, l);
  // DiLoCo: a 2-rank all-reduce inside each cluster's host every step, a 2-cluster exchange of the fp32
  // pseudo-gradient every H steps (a 2-rank exchange is at most what the 4-rank ring moves, then divided by H).
  EXPECT_GT(h10.time.wan_exposed_s, 0.0);
  EXPECT_LT(h10.time.wan_exposed_s + h10.time.dp_exposed_s, flat.time.wan_exposed_s + flat.time.dp_exposed_s);
  expect_rel(h10.time.wan_exposed_s, 10 * h100.time.wan_exposed_s, 1e-12);
  EXPECT_LT(h10.time.step_s, flat.time.step_s);
}

// ---------------------------------------------------------------------------------------------------------------
// Placement across clusters of different device speeds

TEST(PlannerPlacement, FasterClusterGetsTwiceTheBlocks) {
  // Cluster a: one device of 200 TFLOP/s bf16; cluster b: one of 100. pp = 2: rank 0 on a, rank 1 on b.
  // A memory bandwidth of 1 EB/s makes element-wise work (and the optimizer) negligible but not "absent" (see
  // StepIsComputeAloneOnOneRankWithoutMemoryCosts for what a bandwidth of 0 does to the optimizer today).
  const std::string file =
      "[devices.fast]\npeak_tflops = { bf16 = 200 }\nmemory_gb = 80\ngemm_efficiency = 0.5\n"
      "memory_bandwidth_gbs = 1e9\n"
      "[devices.slow]\npeak_tflops = { bf16 = 100 }\nmemory_gb = 80\ngemm_efficiency = 0.5\n"
      "memory_bandwidth_gbs = 1e9\n"
      "[[clusters]]\nname = \"a\"\ndevice = \"fast\"\n"
      "[[clusters]]\nname = \"b\"\ndevice = \"slow\"\n"
      "[links.wan]\nlatency_us = 1000\nbandwidth_gbps = 10\n";
  const ClusterFile c = parse_cluster(file, "hetero.toml");
  // 12 blocks, h = 128, V = 256. The balancer weighs a block 1 / speed (fast 1/2, slow 1), the embedding 0.1
  // and the head h V / (12 h^2) = 256 / 1536 = 1/6, each on its stage's device:
  //   k blocks on a: 0.05 + k / 2; 12 - k on b: 1/6 + (12 - k). k = 8: max(4.05, 4.17) = 4.17;
  //   k = 9: max(4.55, 3.17) = 4.55; k = 7: max(3.55, 5.17) = 5.17. So {8, 4}: twice the blocks on a.
  const ModelShape m = gpt_shape(12, 128, 4, 128, 256);
  Layout l = layout_of(1, 1, 2, 4);
  const Estimate balanced = estimate(m, c, l);
  EXPECT_EQ(balanced.layout.stage_layers, (std::vector<int64_t>{8, 4}));
  // The even split leaves the slow device 6 blocks and the head: a longer step.
  l.stage_layers = {6, 6};
  const Estimate even = estimate(m, c, l);
  EXPECT_LT(balanced.time.step_s, even.time.step_s);
  // Per micro-batch a block costs 3 (24 h^2 + 4 s h) s = 176,160,768 FLOPs, the head 6 h V s = 25,165,824.
  // Balanced: the slow rank is the slowest, 4 blocks + head = 729,808,896 FLOPs at 50e12 per micro-batch; the
  // fast rank's 8 blocks at 100e12 take 1,409,286,144 / 100e12, less. Compute = m x slowest.
  // The memory passes at 1 EB/s add under 1e-6 of that: a block moves 2 bytes x s x 28 h = 917,504 bytes
  // forward and twice that backward, 2.75e-12 s against its 176,160,768 FLOPs' 3.5e-6 s on the slow device.
  expect_rel(balanced.time.compute_s, 4 * 729808896.0 / 50e12, 1e-5);
}

// ---------------------------------------------------------------------------------------------------------------
// Layout words

TEST(PlannerLayout, DescribeParsesBack) {
  const Layout l = parse_layout("dp=2 tp=2 pp=2 zero=1 interleaved v=2 m=4 mb=2 sp recompute=selective fp32 diloco "
                                "H=50 stages=1,1,1,1 cluster_batch=3,1");
  EXPECT_EQ(l.dp, 2);
  EXPECT_EQ(l.tp, 2);
  EXPECT_EQ(l.pp, 2);
  EXPECT_EQ(l.zero, 1);
  EXPECT_EQ(l.schedule, parallel::ScheduleKind::Interleaved1F1B);
  EXPECT_EQ(l.chunks, 2);
  EXPECT_EQ(l.microbatches, 4);
  EXPECT_EQ(l.micro_batch, 2);
  EXPECT_TRUE(l.sequence_parallel);
  EXPECT_EQ(l.recompute, "selective");
  EXPECT_EQ(l.precision, "fp32");
  EXPECT_EQ(l.sync, LayoutSync::DiLoCo);
  EXPECT_EQ(l.inner_steps, 50);
  EXPECT_EQ(l.stage_layers, (std::vector<int64_t>{1, 1, 1, 1}));
  EXPECT_EQ(l.cluster_batch, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(l.devices(), 8);
  EXPECT_EQ(l.global_batch(), 2 * 2 * 4);
  const Layout back = parse_layout(l.describe());
  EXPECT_EQ(back.describe(), l.describe());
  EXPECT_EQ(back.inner_steps, 50);
  EXPECT_EQ(back.cluster_batch, l.cluster_batch);
  // A bare interleaved gets two chunks; dp not given is 0 ("the devices left").
  const Layout bare = parse_layout("pp=2 interleaved");
  EXPECT_EQ(bare.chunks, 2);
  EXPECT_EQ(bare.dp, 0);
}

TEST(PlannerLayout, TrainOverridesCarryEveryChoice) {
  Layout l = parse_layout("dp=2 tp=2 pp=2 zero=1 zb-h1 m=4 mb=2 sp recompute=full bf16 diloco H=50 stages=3,1");
  const std::vector<std::string> o = l.train_overrides();
  auto has = [&](const std::string& s) { return std::find(o.begin(), o.end(), s) != o.end(); };
  for (const char* s : {"parallel.dp=2", "parallel.tp=2", "parallel.pp=2", "parallel.zero=1", "parallel.schedule=zb-h1",
                        "parallel.chunks=1", "parallel.sequence_parallel=true",
                        "train.global_batch=16", "train.micro_batches=4", "train.precision=bf16",
                        "train.recompute=full", "sync.mode=diloco", "sync.inner_steps=50",
                        "parallel.stage_layers=\"3,1\""})
    EXPECT_TRUE(has(s)) << s;
  l.sync = LayoutSync::Hierarchical;
  const std::vector<std::string> h = l.train_overrides();
  EXPECT_NE(std::find(h.begin(), h.end(), "sync.mode=sync"), h.end());
  EXPECT_NE(std::find(h.begin(), h.end(), "sync.hierarchical=true"), h.end());
}

// The scheduler's scope: the shape and, unless plain Sync, how clusters agree; the job's spec and recipe give the
// rest (batch, steps, precision), and a plain Sync leaves the recipe's own sync mode alone.
TEST(PlannerLayout, ShapeAndSyncOverridesLeaveTheRestToTheJob) {
  Layout l = parse_layout("dp=4 tp=2 pp=3 zero=2 1f1b m=6 mb=1 bf16 diloco H=25");
  using V = std::vector<std::string>;
  EXPECT_EQ(l.train_overrides(OverrideScope::ShapeAndSync),
            (V{"parallel.tp=2", "parallel.pp=3", "parallel.zero=2", "sync.mode=diloco", "sync.inner_steps=25"}));
  l.sync = LayoutSync::Hierarchical;
  EXPECT_EQ(l.train_overrides(OverrideScope::ShapeAndSync),
            (V{"parallel.tp=2", "parallel.pp=3", "parallel.zero=2", "sync.hierarchical=true"}));
  l.sync = LayoutSync::Sync;
  EXPECT_EQ(l.train_overrides(OverrideScope::ShapeAndSync), (V{"parallel.tp=2", "parallel.pp=3", "parallel.zero=2"}));
}

TEST(PlannerLayout, SyncWordsReadBackAndUnknownOnesNameTheChoices) {
  for (LayoutSync s : kLayoutSyncs) {
    EXPECT_EQ(parse_layout_sync(to_string(s)), s);
    EXPECT_EQ(parse_layout(std::string("sync=") + to_string(s)).sync, s);
    EXPECT_EQ(parse_layout(to_string(s)).sync, s);
  }
  try {
    parse_layout("dp=2 sync=gossip");
    ADD_FAILURE() << "sync=gossip was accepted";
  } catch (const UsageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("'gossip'"), std::string::npos) << what;
    EXPECT_NE(what.find("sync, hierarchical or diloco"), std::string::npos) << what;
  }
}

TEST(PlannerLayout, BadWordsThrowNamingTheWord) {
  for (const char* bad : {"dp=2 banana", "dp=x", "dp=-1", "dp=", "colour=3", "schedule=zigzag", "stages=2,,x"}) {
    try {
      parse_layout(bad);
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const UsageError& e) {
      const std::string what = e.what();
      EXPECT_FALSE(what.empty());
      if (std::string(bad) == "dp=2 banana") EXPECT_NE(what.find("'banana'"), std::string::npos) << what;
      if (std::string(bad) == "colour=3") EXPECT_NE(what.find("'colour'"), std::string::npos) << what;
    }
  }
}

}  // namespace
}  // namespace crosstrain::planner
