#include "crosstrain/jobs/trainer.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/core/allocator.h"
#include "crosstrain/core/error.h"
#include "crosstrain/core/threads.h"
#include "crosstrain/data/dataset.h"
#include "crosstrain/obs/metrics.h"
#include "crosstrain/obs/metrics_server.h"
#include "crosstrain/obs/step_log.h"
#include "crosstrain/train/loop.h"
#include "crosstrain/jobs/model_family.h"
#include "gpt/run.h"

namespace crosstrain::train {
namespace fs = std::filesystem;

ResolvedRun resolve(const Config& config, int world) { return model_family(config).resolve(config, world); }

ResolvedRun resolve_decoder(const Config& config, int world) {
  ResolvedRun run{config, world, validate(config, world)};
  if (!config.data.path.empty()) data::check_source(config.data);
  return run;
}

struct Trainer::State {
  ResolvedRun run;
  comm::Communicator& world;
};

Trainer::Trainer(ResolvedRun run, comm::Communicator& world)
    : s_(std::make_unique<State>(State{std::move(run), world})) {
  if (s_->run.world != world.size())
    throw Error("Trainer: the config was resolved for " + std::to_string(s_->run.world) + " ranks, the job has " +
                std::to_string(world.size()) + "; resolve it for this world");
}

Trainer::Trainer(Config config, comm::Communicator& world) : Trainer(resolve(config, world.size()), world) {}

Trainer::~Trainer() = default;

TrainResult Trainer::run(const TrainOptions& options) {
  const Config& c = s_->run.config;
  comm::Communicator& world = s_->world;
  const bool leader = world.rank() == 0;
  limit_compute_threads(static_cast<int>(c.train.threads_per_rank));
  keep_freed_memory_for_reuse();
  std::unique_ptr<Job> job = model_family(c).make_job(s_->run, world, options);
  TrainLoop loop(c, options);
  if (leader) loop.open_outputs(options.resume ? job->start_step() : 0);
  job->print_header();
  if (loop.run(*job, world, job->start_step()) == LoopEnd::Stopped)
    loop.finish_stopped(*job, leader);
  else
    loop.finish(*job, leader);
  return loop.result();
}

}  // namespace crosstrain::train
