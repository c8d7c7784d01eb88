#include "crosstrain/jobs/dlrm/trainer.h"

#include <string>

#include "crosstrain/core/error.h"
#include "crosstrain/core/threads.h"
#include "crosstrain/train/loop.h"
#include "crosstrain/train/sync_mode.h"
#include "job.h"
#include "parts.h"

namespace crosstrain::train {

void check_dlrm_config(const Config& c, int world) {
  recsys::check_dlrm(c.dlrm);
  if (c.train.global_batch % world != 0)
    throw UsageError("train.global_batch = " + std::to_string(c.train.global_batch) + " must divide by the " +
                     std::to_string(world) + " ranks (examples per step, split evenly); try " +
                     std::to_string((c.train.global_batch / world + 1) * world));
  if (c.parallel.tp != 1 || c.parallel.pp != 1)
    throw UsageError("model.arch = \"dlrm\" is data parallel with sharded tables: parallel.tp and parallel.pp must be 1");
  const SyncTraits sync = sync_traits(c.sync);
  if (c.dlrm.mode == recsys::DlrmMode::Sharded && !sync.lockstep)
    throw UsageError(std::string("sync.mode = '") + to_string(c.sync.mode) + "' needs dlrm.mode = \"ps\" (tables on the parameter server); "
                     "sharded tables train in lockstep (sync.mode = \"sync\")");
  if (c.dlrm.on_parameter_server() && !sync.parameter_server)
    throw UsageError("dlrm.mode = \"ps\" trains with bounded staleness: set sync.mode = \"ssp\" (or \"async\")");
  plan_tables(c, world);  // the sharding fits the budget, column-wise tables are wide enough
  check_cache_budget(c);
}

struct DlrmTrainer::State {
  Config config;
  comm::Communicator& world;
};

DlrmTrainer::DlrmTrainer(Config config, comm::Communicator& world)
    : s_(std::make_unique<State>(State{std::move(config), world})) {
  check_dlrm_config(s_->config, world.size());
}

DlrmTrainer::~DlrmTrainer() = default;

// The DLRM job through the one training loop, and its result as DLRM figures (tests, benchmarks).
DlrmResult DlrmTrainer::run(const DlrmOptions& options) {
  const Config& c = s_->config;
  limit_compute_threads(static_cast<int>(c.train.threads_per_rank));
  TrainOptions o;
  o.resume = options.resume;
  o.quiet = options.quiet;
  DlrmJob job(c, s_->world, o);
  TrainLoop loop(c, o);
  const bool leader = s_->world.rank() == 0;
  if (leader) loop.open_outputs(o.resume ? job.start_step() : 0);
  job.print_header();
  if (loop.run(job, s_->world, job.start_step()) == LoopEnd::Stopped)
    loop.finish_stopped(job, leader);
  else
    loop.finish(job, leader);
  if (options.gather_tables) job.gather_tables();
  return std::move(job.result());
}

}  // namespace crosstrain::train
