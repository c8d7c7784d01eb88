#include "crosstrain/jobs/model_family.h"

#include "crosstrain/core/error.h"
#include "crosstrain/jobs/dlrm/trainer.h"
#include "dlrm/job.h"
#include "gpt/run.h"

namespace crosstrain::train {
namespace {

std::unique_ptr<Job> make_gpt_job(const ResolvedRun& run, comm::Communicator& world, const TrainOptions& options) {
  RunStart start;
  start.resume = options.resume;
  return std::make_unique<Run>(run.config, *run.dims, world, options, start);
}

ResolvedRun resolve_dlrm(const Config& c, int world) {
  check_dlrm_config(c, world);
  return ResolvedRun{c, world, std::nullopt};
}

std::unique_ptr<Job> make_dlrm_job(const ResolvedRun& run, comm::Communicator& world, const TrainOptions& options) {
  return std::make_unique<DlrmJob>(run.config, world, options);
}

// GPT and Llama share one job: the model layer builds either block from model.arch.
ModelFamily transformer(models::ModelArch arch, const std::string& summary) {
  ModelFamily f;
  f.arch = arch;
  f.name = models::to_string(arch);
  f.summary = summary;
  f.elastic = true;
  f.hugging_face = true;
  f.state_bytes_per_parameter = 16;  // fp32 weights, gradients and two Adam moments
  f.resolve = resolve_decoder;
  f.make_job = make_gpt_job;
  f.parameters = [](const Config& c) { return c.model.parameter_count(); };
  f.stop_check = [](const Config& c) { return sync_traits(c.sync).stop_check; };
  return f;
}

ModelFamily dlrm() {
  ModelFamily f;
  f.arch = models::ModelArch::Dlrm;
  f.name = models::to_string(f.arch);
  f.summary = "recommendation model: sharded embedding tables and a dense MLP ([dlrm])";
  f.elastic = true;  // as one replica: a failure goes back to the newest checkpoint (dlrm.mode = "sharded")
  f.state_bytes_per_parameter = 8;  // tables and their row-wise optimizer state
  f.resolve = resolve_dlrm;
  f.make_job = make_dlrm_job;
  f.parameters = [](const Config& c) {
    const bool tables_in_files = c.dlrm.on_parameter_server() && c.dlrm.ps_storage == recsys::TableStorageKind::Mmap;
    return tables_in_files ? int64_t{0} : c.dlrm.parameter_count();
  };
  f.stop_check = [](const Config& c) { return c.dlrm.on_parameter_server() ? sync_traits(c.sync).stop_check : StopCheck{}; };
  return f;
}

const std::vector<ModelFamily>& registry() {
  static const std::vector<ModelFamily> families = {
      transformer(models::ModelArch::Gpt, "GPT-2 style decoder (learned positions, LayerNorm, GELU)"),
      transformer(models::ModelArch::Llama, "Llama style decoder (RoPE, RMSNorm, SwiGLU, grouped-query attention)"),
      dlrm(),
  };
  return families;
}

}  // namespace

const ModelFamily& model_family(const Config& c) {
  for (const auto& f : registry())
    if (f.arch == c.model.arch) return f;
  // An enum value without an entry: a family added to models::ModelArch but not registered here.
  throw UsageError(std::string("model.arch = '") + models::to_string(c.model.arch) +
                   "' has no entry in the model-family registry (src/jobs/model_family.cpp)");
}

std::vector<std::string> model_family_names() {
  std::vector<std::string> out;
  for (const auto& f : registry()) out.push_back(f.name);
  return out;
}

}  // namespace crosstrain::train
