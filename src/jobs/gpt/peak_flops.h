// The denominator of MFU: this machine's best sustained matrix-multiply rate for one thread, measured at the
// shapes the model itself multiplies, in the run's compute dtype (docs/observability.md, "MFU: how the denominator
// is measured"). A single square product says little: a 512x512 fp32 product and the model's tall, thin
// tokens x n_embd products run at different rates, and bf16 runs at a third rate again.
#pragma once

#include <c10/core/ScalarType.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "crosstrain/models/gpt_config.h"
#include "crosstrain/obs/gemm_timer.h"
#include "crosstrain/train/config.h"

namespace crosstrain::train {

// One product as the model runs it (at::linear): timed by the one GEMM timer, obs/gemm_timer.h.
using GemmShape = obs::GemmShape;

// The forward products of one micro-batch of `model` (tokens_per_micro_batch rows each): the attention's qkv and
// output projections, the MLP's two, and the head (the attention's own T x T products are smaller; left out).
std::vector<GemmShape> gpt_gemm_shapes(const models::GPTConfig& model, int64_t tokens_per_micro_batch);

struct GemmPeak {
  double best_flops = 0;  // the denominator: the highest of by_shape
  std::string best_shape;
  std::vector<std::pair<std::string, double>> by_shape;  // FLOP/s per shape (GemmShape::describe), in order
};

// Times each of gpt_gemm_shapes in `dtype` on the calling thread's intra-op threads (one, in a rank): a warm-up of
// seconds_per_shape / 2, then two runs of at least seconds_per_shape each, the better one counting; the best shape
// is the peak. About 2.5 x seconds_per_shape per shape: 1.3 s for the five at the default 0.1 s.
GemmPeak measure_gemm_peak(const models::GPTConfig& model, int64_t tokens_per_micro_batch, at::ScalarType dtype,
                           double seconds_per_shape = 0.1);

// measure() while this process holds the host's GEMM-timing lock (`lock_path`, flock): the processes of one host
// take turns, those of other hosts measure at once, so each rank's peak is that of its threads with cores to
// themselves. Timed all at once, ranks that outnumber the cores would each measure a share of them, and MFU would
// read high by that factor. No collective: a rank that measures (a restarted elastic rank) waits for no rank that
// does not. A lock not had within `wait` (a stuck process holds it) is given up on: the rank measures anyway.
GemmPeak measure_in_turns_per_host(const std::function<GemmPeak()>& measure,
                                   const std::string& lock_path = "/tmp/crosstrain-gemm-peak.lock",
                                   std::chrono::milliseconds wait = std::chrono::milliseconds(120000));

// A run's own denominator: its model at `micro_batch` sequences per micro-batch in train.precision, the ranks of a
// host in turn. The lock is given up on after a quarter of comm.timeout_s, so that the ranks that measured first
// and then wait for the last one in a collective stay inside its timeout.
GemmPeak measure_model_peak(const Config& c, int64_t micro_batch);

// "best 12.3 GFLOP/s (head 2048x128x256); qkv 2048x128x384 10.1, proj ... GFLOP/s"
std::string describe(const GemmPeak& peak);

}  // namespace crosstrain::train
