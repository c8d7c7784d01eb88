#include "config_cmd.h"

#include <cstdio>
#include <iostream>

#include "crosstrain/core/error.h"
#include "crosstrain/core/machine.h"
#include "crosstrain/jobs/trainer.h"
#include "crosstrain/train/config.h"

namespace crosstrain::apps {
namespace {

// The layout a resolution worked out, as TOML comments.
void print_layout(const train::ResolvedRun& run) {
  std::cout << "# resolved for " << run.world << (run.world == 1 ? " rank" : " ranks");
  if (run.dims)
    std::cout << ": dp " << run.dims->dp() << " x pp " << run.dims->pp() << " x tp " << run.dims->tp() << ", ZeRO "
              << run.dims->zero << ", " << run.dims->microbatches << " micro-batches per step";
  std::cout << "\n";
}

}  // namespace

int config_command(const ConfigCommand& command) {
  if (command.reference) {
    if (!command.recipe.empty() || !command.sets.empty() || command.nproc > 0)
      throw UsageError("config --reference prints every key's default: give it no recipe, --set or --nproc");
    std::cout << train::config_reference();
    return 0;
  }
  train::Config config;
  if (!command.recipe.empty()) {
    config = train::load_config(command.recipe, command.sets);
  } else {
    for (const auto& set : command.sets) train::apply_override(config, set);
    train::check_ranges(config);
  }
  std::cout << "# crosstrain config" << (command.recipe.empty() ? " (defaults)" : " of " + command.recipe)
            << ": every key = its value  # what it does [what it takes; its default]\n";
  if (command.nproc > 0)
    for (const auto& notice : train::host_notices(config, command.nproc, usable_cores()))
      std::cout << "# notice: " << notice << "\n";
  if (command.nproc > 0) print_layout(train::resolve(config, command.nproc));
  for (const auto& notice : train::config_notices(config)) std::cout << "# notice: " << notice << "\n";
  std::cout << "\n" << train::describe_config(config);
  return 0;
}

}  // namespace crosstrain::apps
