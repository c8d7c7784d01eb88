#include "train_cmd.h"

#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <cstdlib>

#include "crosstrain/comm/diagnostics/hang_doctor.h"
#include "crosstrain/comm/init.h"
#include "crosstrain/core/launch_env.h"
#include "crosstrain/core/error.h"
#include "crosstrain/core/fence.h"
#include "crosstrain/core/machine.h"
#include "crosstrain/core/interrupt.h"
#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/jobs/model_family.h"
#include "crosstrain/sync/strategy.h"
#include "crosstrain/train/sync_mode.h"
#include "crosstrain/interop/hf/checkpoint.h"
#include "crosstrain/train/resume_check.h"
#include "crosstrain/jobs/gpt/elastic.h"
#include "crosstrain/jobs/trainer.h"
#include "launcher.h"

namespace crosstrain::apps {
namespace {

// --resume, before any rank starts: the newest checkpoint is whole (sizes and checksums: a broken one names
// the newest intact one instead) and not past train.steps. Reads the checkpoint once; the ranks read it again
// from the page cache.
void check_resume(const train::Config& config) {
  auto latest = checkpoint::latest_checkpoint(config.run.dir);
  if (!latest) throw UsageError("--resume: no checkpoint in '" + config.run.dir + "/checkpoints'");
  int64_t step = 0;
  try {
    checkpoint::CheckpointReader reader(*latest);
    reader.verify(true);
    step = reader.step();
  } catch (const UsageError& e) {
    throw UsageError(std::string(e.what()) + "; " + checkpoint::intact_checkpoint_hint(config.run.dir, *latest));
  }
  train::check_resume_model(config, *latest);  // the same model (config and tensors), before anything loads it
  train::check_resume_step(*latest, step, config.train.steps);
  const std::string notice = train::resume_schedule_notice(config, *latest);
  if (!notice.empty()) std::fprintf(stderr, "crosstrain: %s\n", notice.c_str());
}

// `word` as a shell reads it back: as it is when plain, else in single quotes (with its own quotes escaped).
std::string shell_word(const std::string& word) {
  const bool plain = !word.empty() && word.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                                             "0123456789-_./=:,+@%") == std::string::npos;
  if (plain) return word;
  std::string quoted = "'";
  for (char c : word) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// The command line that continues this run, for the message after Ctrl-C: this binary's real path (a build
// tree's crosstrain is rarely on the PATH), the same arguments, and --resume.
std::string resume_command(const std::vector<std::string>& args) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  std::string out = shell_word(ec ? std::string("crosstrain") : self.string());
  bool resume = false;
  for (const auto& a : args) {
    resume = resume || a == "--resume";
    out += " " + shell_word(a);
  }
  return resume ? out : out + " --resume";
}

// The end of the message after a stop: the checkpoint a run continues from and the command that does it, or that
// there is none yet.
void say_how_to_continue(const train::Config& config, const std::vector<std::string>& args) {
  if (auto latest = checkpoint::latest_checkpoint(config.run.dir))
    std::fprintf(stderr, "The newest checkpoint is %s; continue with: %s\n", latest->c_str(),
                 resume_command(args).c_str());
  else
    std::fprintf(stderr, "No checkpoint was written yet (train.checkpoint_every = %lld), so the run starts over "
                 "next time; a smaller train.checkpoint_every saves on the way\n",
                 static_cast<long long>(config.train.checkpoint_every));
}

// After a stop every rank agreed on: where it stopped and how to go on.
void say_interrupted(const train::Config& config, const train::TrainResult& result,
                     const std::vector<std::string>& args) {
  std::fprintf(stderr, "crosstrain: interrupted (%s) after step %lld of %lld; no checkpoint was left half-written. ",
               interrupt_signal() == SIGTERM ? "SIGTERM" : "SIGINT", static_cast<long long>(result.stopped_after),
               static_cast<long long>(config.train.steps));
  say_how_to_continue(config, args);
}

// The job secret: CROSSTRAIN_SECRET, else run.secret_file (refused when others can read it), else none.
std::string job_secret(const LaunchEnv& env, const train::Config& config) {
  if (!env.secret.empty() || config.run.secret_file.empty()) return env.secret;
  return comm::store::read_secret_file(config.run.secret_file);
}

// One rank of an elastic job (jobs/gpt/elastic.h): membership first, then a Run per generation.
int train_elastic_rank(const train::Config& config, const LaunchEnv& env, const std::vector<std::string>& args) {
  if (env.source == LaunchSource::Single)
    throw UsageError("elastic training needs a launcher that restarts ranks and hosts the coordinator: use "
                     "crosstrain train --nproc N --max-restarts K, or crosstrain run --max-restarts K -- ...");
  train::TrainOptions options;
  const char* tty = std::getenv("CROSSTRAIN_TTY");
  options.progress_bar = tty && std::string(tty) == "1";
  // Ctrl-C (forwarded by the launcher) rides on the step vote: every member saves the step it committed and stops.
  catch_interrupt();
  options.stop_requested = interrupt_requested;
  const train::TrainResult result = train::train_elastic(config, env, options);
  if (result.stopped_after < 0) return 0;
  // Every live member says it; the launcher prints the identical lines once, with their ranks.
  say_interrupted(config, result, args);
  return 128 + (interrupt_signal() ? interrupt_signal() : SIGINT);
}

}  // namespace

int train_command(const TrainCommand& cmd, const std::vector<std::string>& relaunch_args) {
  // Read the config before starting any rank: a typo is reported once, not once per rank.
  train::Config config = train::load_config(cmd.config_path, cmd.sets);
  if (cmd.max_restarts >= 0) {
    config.elastic.enabled = true;
    config.elastic.max_restarts = cmd.max_restarts;
  }
  const char* elastic_env = std::getenv("CROSSTRAIN_ELASTIC");
  if (elastic_env && std::string(elastic_env) == "1") config.elastic.enabled = true;
  LaunchEnv env = detect_launch_env(current_environment());
  env.secret = job_secret(env, config);
  const bool launching = env.source == LaunchSource::Single && cmd.nproc > 1;
  const train::ModelFamily& family = train::model_family(config);
  if (!family.elastic && config.elastic.enabled)
    throw UsageError("elastic training (--max-restarts, elastic.enabled) is not available for model.arch = \"" +
                     family.name + "\" yet: resume from its checkpoints with --resume instead");
  // Resolved once: by the process the user started for every rank it will start (before any exists), and in
  // each rank for its world; the Trainer takes the result as it is.
  train::ResolvedRun run = train::resolve(config, launching ? cmd.nproc : env.world_size);
  if (config.elastic.enabled) train::check_elastic_config(config, launching ? cmd.nproc : env.world_size);
  // Elastic training resumes from the newest checkpoint by itself when no live replica holds the state.
  if (!cmd.resume && !config.elastic.enabled && checkpoint::latest_checkpoint(config.run.dir))
    throw UsageError("run.dir '" + config.run.dir + "' already holds checkpoints of an earlier run; continue it with " +
                     "--resume, or choose another run.dir (nothing was changed)");
  // Once, by the process the user started (launched ranks are not); the Trainer still checks the step.
  if (cmd.resume && env.source == LaunchSource::Single) check_resume(config);
  // model.init_from against the recipe, from headers only, once rather than once per rank (--resume does not use it).
  if (!cmd.resume && env.source == LaunchSource::Single && !config.model_init_from.empty())
    train::check_initial_weights(config.model_init_from, config.model);
  // Once every check passed, and once, by the process the user started: what may surprise in this config.
  if (env.source == LaunchSource::Single) {
    auto notices = train::config_notices(config);
    if (launching)
      for (auto& n : train::host_notices(config, cmd.nproc, usable_cores())) notices.push_back(std::move(n));
    for (const auto& notice : notices) std::fprintf(stderr, "crosstrain: notice: %s\n", notice.c_str());
  }
  if (launching) {
    // Ranks write into pipes; tell rank 0 whether a person is watching.
    if (isatty(STDOUT_FILENO)) setenv("CROSSTRAIN_TTY", "1", 1);
    // At the least, each rank holds its share of the model state (GPT: fp32 weights, gradients and two Adam
    // moments; DLRM: tables and their row-wise state) even when every layout shards it as far as it goes.
    const int64_t state_per_rank = family.state_bytes_per_parameter * family.parameters(config) / cmd.nproc;
    ElasticLaunch elastic;
    elastic.enabled = config.elastic.enabled;
    elastic.max_restarts = static_cast<int>(config.elastic.max_restarts);
    // Ctrl-C stops every rank at a step they agree on (train/stop_vote.h). Where they hear it only every few steps
    // (DiLoCo's outer steps, ssp, async, gossip) that may be minutes away: the ranks get 10 minutes to get there
    // (a second Ctrl-C still ends them at once); elsewhere a step and a save get 30 s.
    const auto grace = std::chrono::seconds(family.stop_check(config).every > 1 ? 600 : 30);
    return launch_self(cmd.nproc, relaunch_args, config.comm.timeout(), state_per_rank, env.secret, elastic, grace);
  }
  // A site without a shared disk has no scheduler to write its fence: each rank moves it to its own placement's
  // token, and a placement that a later one took over does not train there at all.
  if (const std::string refusal = advance_fence(config.run.dir, config.run.fence); !refusal.empty())
    throw UsageError("crosstrain train: " + refusal + "; nothing was trained or written");
  if (config.elastic.enabled) return train_elastic_rank(config, env, relaunch_args);
  auto world = comm::init_world(env, config.comm, train::cluster_of_this_node(config.sync.topology));
  train::Trainer trainer(std::move(run), *world);
  train::TrainOptions options;
  options.resume = cmd.resume;
  // A timeout asks the other ranks, through the job's store, which of them never got there (MPI jobs have no
  // store of ours; a single process has nobody to ask).
  std::unique_ptr<comm::HangDoctor> doctor;
  if (config.comm.backend == "gloo" && env.source != LaunchSource::Single && env.world_size > 1) {
    doctor = std::make_unique<comm::HangDoctor>(env, comm::Millis(1000), config.comm.timeout());
    options.hang_doctor = doctor.get();
  }
  const char* tty = std::getenv("CROSSTRAIN_TTY");
  options.progress_bar = (tty && std::string(tty) == "1") || (env.source == LaunchSource::Single && isatty(STDOUT_FILENO));
  // The launcher forwards Ctrl-C to every rank; each finishes the step the ranks agree on and saves it.
  catch_interrupt();
  options.stop_requested = interrupt_requested;
  const train::TrainResult result = trainer.run(options);
  if (result.stopped_after < 0) return 0;
  if (world->rank() == 0) say_interrupted(config, result, relaunch_args);
  return 128 + (interrupt_signal() ? interrupt_signal() : SIGINT);
}

}  // namespace crosstrain::apps
