// The model families crosstrain trains, by model.arch: one registry instead of a switch in every layer.
//
// A family says how a config of it is checked (without building anything), how one rank's job is built for the
// training loop (train/job.h, train/loop.h), and what it supports. Adding a family is a Job and one entry in
// src/jobs/model_family.cpp; the command line, the launcher and the loop need no change.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "crosstrain/comm/communicator.h"
#include "crosstrain/train/config.h"
#include "crosstrain/train/job.h"
#include "crosstrain/jobs/trainer.h"

namespace crosstrain::train {

struct ModelFamily {
  models::ModelArch arch;
  std::string name;  // model.arch as a recipe writes it (models::to_string(arch))
  std::string summary;
  bool elastic = false;            // elastic training (jobs/gpt/elastic.h) can run it
  bool hugging_face = false;       // Hugging Face import and export (interop/hf/checkpoint.h)
  int state_bytes_per_parameter;   // model state each parameter costs at the least (the launcher's memory check)
  // Checks a config of this family for `world` ranks and works out what follows from it (the layout); UsageError
  // with one clear line.
  std::function<ResolvedRun(const Config&, int world)> resolve;
  // One rank's job (resumed when options.resume), from a config resolved for every rank of the job (`world`).
  std::function<std::unique_ptr<Job>(const ResolvedRun&, comm::Communicator& world, const TrainOptions&)> make_job;
  // The parameters whose state a rank holds (DLRM tables kept in files count none).
  std::function<int64_t(const Config&)> parameters;
  // When the ranks of a run hear a Ctrl-C together (Job::stop_check), known before any rank starts.
  std::function<StopCheck(const Config&)> stop_check;
};

// The family of c.model.arch (parsed when the config was read: models::parse_model_arch names the choices).
const ModelFamily& model_family(const Config& c);
std::vector<std::string> model_family_names();

}  // namespace crosstrain::train
