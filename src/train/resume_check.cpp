#include "crosstrain/train/resume_check.h"

#include <toml++/toml.h>

#include <filesystem>
#include <set>
#include <sstream>

#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/core/error.h"
#include "crosstrain/models/model_identity.h"
#include "crosstrain/models/parallel_plan.h"
#include "crosstrain/recsys/dlrm_identity.h"

namespace crosstrain::train {
namespace fs = std::filesystem;

namespace {

std::string quoted(const std::string& s) { return "\"" + s + "\""; }

std::string join(const std::vector<std::string>& items, const std::string& separator, size_t most) {
  std::string out;
  for (size_t i = 0; i < items.size() && i < most; ++i) out += (i ? separator : "") + items[i];
  if (items.size() > most) out += separator + "... (" + std::to_string(items.size()) + " in all)";
  return out;
}

bool same_path(const std::string& a, const std::string& b) {
  if (a == b) return true;
  std::error_code ec;
  return !a.empty() && !b.empty() && fs::equivalent(a, b, ec);
}

// The tensors a GPT-family run trains, hence saves: its parameters but those train.freeze keeps fixed.
std::set<std::string> trained_tensors(const Config& c) {
  const models::ParallelPlan plan(c.model);
  const std::set<std::string> frozen = models::frozen_parameters(plan, c.model, c.train.freeze);
  std::set<std::string> out;
  for (const auto& p : plan.parameters())
    if (!frozen.count(p.name)) out.insert(p.name);
  return out;
}

// ". Nothing was changed. ...": the end of every refusal (DLRM has no model.init_from).
std::string refusal_end(const Config& run, const std::string& dir) {
  const std::string same = ". Nothing was changed. Resume with the settings the run was saved with (its "
                           "run.dir/config.toml), or ";
  if (run.model.arch == models::ModelArch::Dlrm) return same + "train this model in a new run.dir";
  return same + "start a new run from these weights on purpose: --set model.init_from=" + dir + " with a new run.dir";
}

}  // namespace

std::vector<std::string> resume_differences(const Config& saved, const Config& run) {
  std::vector<std::string> out = models::model_differences(saved.model, run.model);
  if (saved.model.arch == models::ModelArch::Dlrm && run.model.arch == models::ModelArch::Dlrm) {
    const auto dlrm = recsys::dlrm_model_differences(saved.dlrm, run.dlrm);
    out.insert(out.end(), dlrm.begin(), dlrm.end());
  }
  if (!out.empty() || run.model.arch == models::ModelArch::Dlrm) return out;
  // Fine-tuning: a checkpoint holds only what its run trained, and a resumed run reads the fixed weights from
  // model.init_from again.
  const models::ParallelPlan plan(run.model);
  const auto frozen = models::frozen_parameters(plan, run.model, run.train.freeze);
  if (models::frozen_parameters(plan, saved.model, saved.train.freeze) != frozen)
    out.push_back("train.freeze: " + quoted(saved.train.freeze) + " -> " + quoted(run.train.freeze));
  else if (!frozen.empty() && !same_path(saved.model_init_from, run.model_init_from))
    out.push_back("model.init_from: " + quoted(saved.model_init_from) + " -> " + quoted(run.model_init_from));
  return out;
}

Config saved_model_config(const std::string& text, const std::string& origin) {
  toml::table all;
  try {
    all = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    throw UsageError("the config saved in " + origin + " does not read as TOML (line " +
                     std::to_string(e.source().begin.line) + ": " + std::string(e.description()) + ")");
  }
  toml::table kept;
  for (const char* section : {"model", "dlrm"})
    if (const toml::table* t = all[section].as_table()) kept.insert(section, *t);
  if (const auto* freeze = all["train"]["freeze"].as_string()) kept.insert("train", toml::table{{"freeze", freeze->get()}});
  std::ostringstream out;
  out << kept;
  return parse_config(out.str(), origin);
}

void check_resume_model(const Config& run, const std::string& checkpoint_dir) {
  const checkpoint::CheckpointReader reader(checkpoint::resolve_checkpoint(checkpoint_dir));
  const std::string dir = reader.dir(), manifest = dir + "/manifest.json";
  const std::string text = reader.info().value("config", "");
  if (!text.empty()) {
    const auto differences = resume_differences(saved_model_config(text, manifest), run);
    if (!differences.empty())
      throw UsageError("--resume: checkpoint '" + dir + "' was saved from another model than this run's (" +
                       join(differences, "; ", differences.size()) + "; checkpoint -> this run)" + refusal_end(run, dir));
  }
  if (run.model.arch == models::ModelArch::Dlrm) return;
  // The same config holds the same tensors; this catches the rest (a manifest without a config, a damaged one).
  const std::set<std::string> wanted = trained_tensors(run);
  std::set<std::string> held;
  for (const auto& t : reader.tensors()) held.insert(t.substr(0, t.find('#')));  // "NAME#exp_avg", "NAME#copy1"
  std::vector<std::string> missing, extra;
  for (const auto& name : wanted)
    if (!held.count(name)) missing.push_back(name);
  for (const auto& name : held)
    if (!wanted.count(name)) extra.push_back(name);
  if (missing.empty() && extra.empty()) return;
  std::vector<std::string> parts;
  if (!missing.empty()) parts.push_back("tensors this run trains that it lacks: " + join(missing, ", ", 5));
  if (!extra.empty()) parts.push_back("tensors this model does not train: " + join(extra, ", ", 5));
  throw UsageError("--resume: checkpoint '" + dir + "' (" + manifest + ") does not hold this run's model: " +
                   join(parts, "; ", parts.size()) + refusal_end(run, dir));
}

std::string resume_schedule_notice(const Config& run, const std::string& checkpoint_dir) {
  const checkpoint::CheckpointReader reader(checkpoint::resolve_checkpoint(checkpoint_dir));
  const std::string text = reader.info().value("config", "");
  if (text.empty()) return "";
  int64_t saved = run.train.steps;
  try {
    saved = toml::parse(text, reader.dir() + "/manifest.json")["train"]["steps"].value_or(run.train.steps);
  } catch (const toml::parse_error&) {
    return "";  // check_resume_model names a config that does not read
  }
  if (saved == run.train.steps) return "";
  return "notice: train.steps = " + std::to_string(run.train.steps) + " where the checkpoint's run had " +
         std::to_string(saved) + ": the learning-rate schedule (warmup, then cosine down to train.min_lr) now ends " +
         "at step " + std::to_string(run.train.steps) + ", so the rates from here on differ from the saved run's";
}

void check_resume_step(const std::string& checkpoint, int64_t checkpoint_step, int64_t steps) {
  if (checkpoint_step > steps)
    throw UsageError("--resume: checkpoint " + checkpoint + " is at step " + std::to_string(checkpoint_step) +
                     " but train.steps = " + std::to_string(steps) + "; set train.steps to " +
                     std::to_string(checkpoint_step) + " or more to continue this run (nothing was changed)");
}

}  // namespace crosstrain::train
