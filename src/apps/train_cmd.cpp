#include "train_cmd.h"

#include <unistd.h>

#include <cstdlib>

#include "crosstrain/comm/init.h"
#include "crosstrain/core/launch_env.h"
#include "crosstrain/core/error.h"
#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/train/trainer.h"
#include "launcher.h"

namespace crosstrain::apps {

int train_command(const TrainCommand& cmd, const std::vector<std::string>& relaunch_args) {
  // Read the config before starting any rank: a typo is reported once, not once per rank.
  train::Config config = train::load_config(cmd.config_path, cmd.sets);
  LaunchEnv env = detect_launch_env(current_environment());
  const bool launching = env.source == LaunchSource::Single && cmd.nproc > 1;
  train::check_config(config, launching ? cmd.nproc : env.world_size);
  if (!cmd.resume && checkpoint::latest_checkpoint(config.run.dir))
    throw UsageError("run.dir '" + config.run.dir + "' already holds checkpoints of an earlier run; continue it with " +
                     "--resume, or choose another run.dir (nothing was changed)");
  if (launching) {
    // Ranks write into pipes; tell rank 0 whether a person is watching.
    if (isatty(STDOUT_FILENO)) setenv("CROSSTRAIN_TTY", "1", 1);
    return launch_self(cmd.nproc, relaunch_args,
                       std::chrono::milliseconds(static_cast<int64_t>(config.comm.timeout_s * 1000)));
  }
  comm::CommConfig comm_config;
  comm_config.backend = config.comm.backend;
  comm_config.timeout = comm::Millis(static_cast<int64_t>(config.comm.timeout_s * 1000));
  comm_config.shared_memory = config.comm.shared_memory;
  comm_config.algo = config.comm.algo;
  comm_config.topology = config.comm.topology;
  auto world = comm::init_world(env, comm_config);
  train::Trainer trainer(config, *world);
  train::TrainOptions options;
  options.resume = cmd.resume;
  const char* tty = std::getenv("CROSSTRAIN_TTY");
  options.progress_bar = (tty && std::string(tty) == "1") || (env.source == LaunchSource::Single && isatty(STDOUT_FILENO));
  trainer.run(options);
  return 0;
}

}  // namespace crosstrain::apps
