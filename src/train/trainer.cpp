#include "crosstrain/train/trainer.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "crosstrain/core/allocator.h"
#include "crosstrain/core/error.h"
#include "crosstrain/core/threads.h"
#include "crosstrain/data/dataset.h"
#include "crosstrain/data/sampler.h"
#include "crosstrain/data/tokenizer.h"
#include "crosstrain/models/gpt.h"
#include "crosstrain/obs/metrics.h"
#include "crosstrain/parallel/grad_reducer.h"
#include "crosstrain/train/checkpoint.h"
#include "crosstrain/train/schedule.h"

namespace crosstrain::train {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Single-thread matmul throughput: the denominator of MFU on a CPU, where no datasheet peak applies.
double measure_peak_flops() {
  torch::NoGradGuard no_grad;
  const int64_t n = 512;
  auto a = torch::randn({n, n}), b = torch::randn({n, n});
  torch::matmul(a, b);
  int iters = 0;
  auto start = Clock::now();
  while (seconds_since(start) < 0.3 || iters < 3) {
    auto c = torch::matmul(a, b);
    ++iters;
  }
  return 2.0 * n * n * n * iters / seconds_since(start);
}

void validate(const Config& c, int world) {
  c.model.validate();
  auto need = [](bool ok, const std::string& message) {
    if (!ok) throw UsageError(message);
  };
  need(c.train.steps >= 1, "train.steps must be at least 1");
  need(c.train.micro_batches >= 1, "train.micro_batches must be at least 1");
  need(c.train.lr > 0 && c.train.min_lr >= 0, "train.lr must be positive and train.min_lr non-negative");
  need(c.train.threads_per_rank >= 1, "train.threads_per_rank must be at least 1");
  need(c.run.log_every >= 1, "run.log_every must be at least 1");
  need(c.parallel.dp == 0 || c.parallel.dp == world,
       "parallel.dp = " + std::to_string(c.parallel.dp) + " but the job has " + std::to_string(world) +
           " ranks; data parallelism is the only axis so far, so dp must equal the world size (or be 0)");
  const int64_t dp = world;
  need(c.train.global_batch % (dp * c.train.micro_batches) == 0,
       "train.global_batch = " + std::to_string(c.train.global_batch) + " is not divisible by " + std::to_string(dp) +
           " data-parallel ranks x " + std::to_string(c.train.micro_batches) + " micro-batches; use a multiple of " +
           std::to_string(dp * c.train.micro_batches));
  need(c.model.vocab_size >= 256 || c.data.format == "bin",
       "model.vocab_size must be at least 256 for byte-level text");
}

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

}  // namespace

struct Trainer::State {
  Config config;
  comm::Communicator& world;
  models::GPT model{nullptr};
  std::unique_ptr<torch::optim::AdamW> optimizer;
  std::unique_ptr<parallel::BucketedAllReduce> reducer;
  data::Splits splits;
  std::unique_ptr<data::DistributedSampler> sampler;
  State(Config c, comm::Communicator& w) : config(std::move(c)), world(w) {}
};

Trainer::Trainer(Config config, comm::Communicator& world) : s_(std::make_unique<State>(std::move(config), world)) {
  validate(s_->config, world.size());
}

Trainer::~Trainer() = default;

TrainResult Trainer::run(const TrainOptions& options) {
  State& s = *s_;
  const Config& c = s.config;
  comm::Communicator& world = s.world;
  const bool leader = world.rank() == 0;
  const bool talk = leader && !options.quiet;
  limit_compute_threads(static_cast<int>(c.train.threads_per_rank));
  keep_freed_memory_for_reuse();

  // Model: the same full model on every rank, from the seed alone.
  s.model = models::GPT(c.model, c.run.seed);
  std::vector<torch::Tensor> decay, no_decay;
  for (auto& p : s.model->named_parameters()) (p.value().dim() >= 2 ? decay : no_decay).push_back(p.value());
  auto adamw = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(c.train.lr).betas({c.train.beta1, c.train.beta2}).eps(c.train.eps).weight_decay(wd));
  };
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(decay, adamw(c.train.weight_decay));
  groups.emplace_back(no_decay, adamw(0.0));
  s.optimizer = std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(c.train.lr));

  parallel::BucketConfig buckets;
  buckets.bucket_bytes = static_cast<int64_t>(c.parallel.bucket_mb * (1 << 20));
  s.reducer = std::make_unique<parallel::BucketedAllReduce>(s.model->parameters(), &world, buckets);

  s.splits = data::load_dataset(c.data, c.model.block_size);
  if (static_cast<int64_t>(s.splits.train.max_token()) >= c.model.vocab_size)
    throw UsageError("data '" + c.data.path + "' holds token " + std::to_string(s.splits.train.max_token()) +
                     " but model.vocab_size is " + std::to_string(c.model.vocab_size));
  const int dp = world.size();
  s.sampler = std::make_unique<data::DistributedSampler>(c.run.seed, static_cast<int64_t>(s.splits.train.size()),
                                                         c.model.block_size, c.train.global_batch, world.rank(), dp,
                                                         static_cast<int>(c.train.micro_batches));

  // Resume: every rank loads the newest checkpoint (written by rank 0).
  int64_t start_step = 1;
  if (options.resume) {
    auto latest = latest_checkpoint(c.run.dir);
    if (!latest) throw UsageError("--resume: no checkpoint in '" + c.run.dir + "/checkpoints'");
    CheckpointState st = load_checkpoint(*latest, *s.model, *s.optimizer);
    s.sampler->restore(st.sampler);
    start_step = st.step + 1;
    if (talk) std::printf("resumed from %s (step %lld)\n", latest->c_str(), static_cast<long long>(st.step));
  }
  s.reducer->zero_grad();

  std::unique_ptr<obs::MetricsWriter> metrics;
  const std::string config_toml = to_toml(c);
  if (leader) {
    fs::create_directories(c.run.dir);
    std::ofstream(fs::path(c.run.dir) / "config.toml") << config_toml;
    metrics = std::make_unique<obs::MetricsWriter>((fs::path(c.run.dir) / "metrics.jsonl").string(),
                                                   options.resume ? start_step : 0);
  }
  double peak = c.train.peak_flops_per_rank > 0 ? c.train.peak_flops_per_rank : measure_peak_flops();
  {
    // Every rank measured its own; use the mean so MFU is one number.
    at::Tensor t = at::full({1}, peak, at::kDouble);
    world.all_reduce(t, comm::ReduceOp::Avg)->wait();
    peak = t.item<double>();
  }
  const double tokens_per_step = static_cast<double>(c.train.global_batch * c.model.block_size);
  if (talk) {
    std::printf("crosstrain train: %s, %lld parameters, %d data-parallel ranks, %s\n", c.run.name.c_str(),
                static_cast<long long>(c.model.parameter_count()), dp, s.splits.description.c_str());
    std::printf("  %lld steps x %lld sequences x %lld tokens; %d gradient buckets; run dir %s\n",
                static_cast<long long>(c.train.steps), static_cast<long long>(c.train.global_batch),
                static_cast<long long>(c.model.block_size), s.reducer->bucket_count(), c.run.dir.c_str());
    std::fflush(stdout);
  }

  auto evaluate = [&]() -> double {
    torch::NoGradGuard no_grad;
    s.model->eval();
    // Fixed validation batches, split across ranks like training batches.
    data::DistributedSampler val(c.run.seed ^ 0x5eedULL, static_cast<int64_t>(s.splits.val.size()), c.model.block_size,
                                 c.train.global_batch, world.rank(), dp, 1);
    double total = 0;
    for (int64_t b = 0; b < c.train.eval_batches; ++b) {
      torch::Tensor x, y;
      data::make_batch(s.splits.val, val.local_offsets(b, 0), c.model.block_size, x, y);
      total += s.model->loss(x, y).item<double>();
    }
    at::Tensor t = at::full({1}, total / static_cast<double>(c.train.eval_batches), at::kDouble);
    world.all_reduce(t, comm::ReduceOp::Avg)->wait();
    s.model->train();
    return t.item<double>();
  };

  TrainResult result;
  auto run_start = Clock::now();
  for (int64_t step = start_step; step <= c.train.steps; ++step) {
    world.set_step(step);
    const auto t0 = Clock::now();
    const double lr = learning_rate(step, c.train.warmup_steps, c.train.steps, c.train.lr, c.train.min_lr);
    for (auto& group : s.optimizer->param_groups())
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    // Dropout masks depend on (seed, rank, step) only, so a resumed run draws the same ones.
    torch::manual_seed(c.run.seed * 1000003ULL + static_cast<uint64_t>(world.rank()) * 7919ULL + static_cast<uint64_t>(step));

    double local_loss = 0;
    for (int64_t m = 0; m < c.train.micro_batches; ++m) {
      torch::Tensor x, y;
      data::make_batch(s.splits.train, s.sampler->local_offsets(step, static_cast<int>(m)), c.model.block_size, x, y);
      const bool sync = m == c.train.micro_batches - 1;
      s.reducer->set_sync(sync);
      auto loss = s.model->loss(x, y) / static_cast<double>(c.train.micro_batches);
      local_loss += loss.item<double>();
      // The loss rides with the gradients: averaged over the ranks in the same collective.
      if (sync) s.reducer->set_side_value(0, local_loss);
      loss.backward();
    }
    s.reducer->finish();
    // The loss of the global batch: the mean of the ranks' means (equal shares).
    const double global_loss = s.reducer->side_value(0);
    double grad_norm = s.reducer->gradient_norm();
    if (c.train.grad_clip > 0 && grad_norm > c.train.grad_clip)
      s.reducer->scale_gradients(c.train.grad_clip / (grad_norm + 1e-6));
    s.optimizer->step();
    s.reducer->zero_grad();
    s.sampler->mark_done(step);

    StepRecord rec;
    rec.step = step;
    rec.loss = global_loss;
    rec.lr = lr;
    rec.grad_norm = grad_norm;
    rec.step_time_s = seconds_since(t0);
    rec.tokens_per_s = tokens_per_step / rec.step_time_s;
    rec.comm_time_s = s.reducer->stats().comm_time_s;
    rec.exposed_comm_time_s = s.reducer->stats().exposed_comm_time_s;
    result.steps.push_back(rec);
    if (!std::isfinite(rec.loss))
      throw Error("step " + std::to_string(step) + ": the loss is " + std::to_string(rec.loss) +
                  "; lower train.lr or check the data");

    double val_loss = -1;
    if (c.train.eval_every > 0 && (step % c.train.eval_every == 0 || step == c.train.steps) && c.data.val_fraction > 0)
      val_loss = result.val_loss = evaluate();

    if (leader) {
      const double mfu = c.model.flops_per_token() * rec.tokens_per_s / (peak * dp);
      nlohmann::json row = {{"step", step},
                            {"loss", rec.loss},
                            {"lr", lr},
                            {"grad_norm", grad_norm},
                            {"tokens_per_s", rec.tokens_per_s},
                            {"mfu", mfu},
                            {"step_time_s", rec.step_time_s},
                            {"comm_time_s", rec.comm_time_s},
                            {"exposed_comm_time_s", rec.exposed_comm_time_s},
                            {"tokens", static_cast<double>(step) * tokens_per_step},
                            {"peak_rss_bytes", obs::peak_rss_bytes()}};
      if (val_loss >= 0) row["val_loss"] = val_loss;
      metrics->write(row.dump());
      if (!options.quiet && (step % c.run.log_every == 0 || step == c.train.steps || val_loss >= 0)) {
        const int64_t done = step, total = c.train.steps;
        std::string line = "step " + std::to_string(done) + "/" + std::to_string(total) + " | loss " +
                           fmt("%.4f", rec.loss) + (val_loss >= 0 ? " | val " + fmt("%.4f", val_loss) : "") +
                           " | lr " + fmt("%.2e", lr) + " | " + fmt("%.0f", rec.tokens_per_s) + " tok/s | mfu " +
                           fmt("%.1f%%", 100 * mfu) + " | comm " + fmt("%.0f", 1000 * rec.comm_time_s) +
                           " ms (exposed " + fmt("%.0f", 1000 * rec.exposed_comm_time_s) + ")";
        if (options.progress_bar) {
          const int width = 24;
          const int filled = static_cast<int>(width * done / total);
          std::string bar = "[" + std::string(filled, '=') + std::string(width - filled, ' ') + "] ";
          std::printf("\r%s%s\033[K", bar.c_str(), line.c_str());
          if (done == total || val_loss >= 0) std::printf("\n");
        } else {
          std::printf("%s\n", line.c_str());
        }
        std::fflush(stdout);
      }
    }
    const bool last = step == c.train.steps;
    if ((c.train.checkpoint_every > 0 && step % c.train.checkpoint_every == 0) || last) {
      if (leader) {
        CheckpointState st{step, s.sampler->state(), config_toml};
        auto dir = save_checkpoint(c.run.dir, st, *s.model, *s.optimizer);
        if (talk && !options.progress_bar) std::printf("saved checkpoint %s\n", dir.c_str());
      }
      world.barrier()->wait();  // nobody runs ahead of a checkpoint being written
    }
  }
  if (talk) {
    std::printf("trained %lld steps in %.1f s\n", static_cast<long long>(c.train.steps - start_step + 1),
                seconds_since(run_start));
  }
  if (leader && c.train.sample_tokens > 0) {
    data::ByteTokenizer tok;
    auto prompt = torch::full({1, 1}, static_cast<int64_t>('\n'), torch::kLong);
    auto out = s.model->generate(prompt, c.train.sample_tokens, 0.8, 40, c.run.seed);
    std::vector<int64_t> ids(out.data_ptr<int64_t>() + 1, out.data_ptr<int64_t>() + out.numel());
    result.sample = tok.decode(ids);
    if (talk) std::printf("--- sample (%lld tokens) ---\n%s\n---\n", static_cast<long long>(c.train.sample_tokens),
                          result.sample.c_str());
  }
  if (options.keep_parameters) {
    for (const auto& p : s.model->named_parameters()) {
      auto flat = p.value().detach().reshape(-1).contiguous();
      result.parameters.insert(result.parameters.end(), flat.data_ptr<float>(), flat.data_ptr<float>() + flat.numel());
    }
  }
  return result;
}

}  // namespace crosstrain::train
