#include "crosstrain/train/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <iomanip>
#include <sstream>
#include <stdexcept>

#include "crosstrain/core/error.h"
#include "crosstrain/train/sync_mode.h"

#include "crosstrain/train/debug_fault.h"

namespace crosstrain::train {
namespace {

// One configurable key: how to set it from a TOML node, how to print it, and what it takes (for `crosstrain config`).
struct Field {
  std::string section, key;
  std::function<void(const toml::node&, const std::string& where)> set;
  std::function<std::string()> show;
  std::string type;
};

[[noreturn]] void wrong_type(const std::string& where, const char* expected, const toml::node& node) {
  std::ostringstream got;
  node.visit([&](const auto& v) {
    if constexpr (toml::is_string<decltype(v)>) got << '"' << v.get() << '"';
    else if constexpr (toml::is_value<decltype(v)>) got << v.get();
    else got << "a " << (toml::is_table<decltype(v)> ? "table" : "array");
  });
  throw UsageError(where + " must be " + expected + ", got " + got.str());
}

Field int_field(const char* section, const char* key, int64_t& ref) {
  return {section, key,
          [&ref](const toml::node& n, const std::string& where) {
            if (!n.is_integer()) wrong_type(where, "an integer", n);
            ref = n.as_integer()->get();
          },
          [&ref] { return std::to_string(ref); },
          "integer"};
}

Field uint_field(const char* section, const char* key, uint64_t& ref) {
  return {section, key,
          [&ref](const toml::node& n, const std::string& where) {
            if (!n.is_integer() || n.as_integer()->get() < 0) wrong_type(where, "a non-negative integer", n);
            ref = static_cast<uint64_t>(n.as_integer()->get());
          },
          [&ref] { return std::to_string(ref); },
          "integer >= 0"};
}

Field double_field(const char* section, const char* key, double& ref) {
  return {section, key,
          [&ref](const toml::node& n, const std::string& where) {
            double v = 0;
            if (n.is_floating_point()) v = n.as_floating_point()->get();
            else if (n.is_integer()) v = static_cast<double>(n.as_integer()->get());
            else wrong_type(where, "a number", n);
            // TOML spells inf and nan; no setting means anything by them, and they would only surface later
            // as a NaN loss or a wait that never ends.
            if (!std::isfinite(v)) wrong_type(where, "a finite number", n);
            ref = v;
          },
          [&ref] {
            std::ostringstream out;
            out << toml::value<double>(ref);
            return out.str();
          },
          "number"};
}

Field string_field(const char* section, const char* key, std::string& ref) {
  return {section, key,
          [&ref](const toml::node& n, const std::string& where) {
            if (!n.is_string()) wrong_type(where, "a string", n);
            ref = n.as_string()->get();
          },
          [&ref] {
            std::ostringstream out;
            out << toml::value<std::string>(ref);
            return out.str();
          },
          "string"};
}

// Every name of an enum, in order ("sync, diloco, ssp"): the config's enums number their values from 0 and name
// an unknown value "?" (core/named_enum.h), so the names are read off until the first "?".
template <typename Enum>
std::string names_of(const char* (*name)(Enum)) {
  std::string out;
  for (int i = 0; i < 64 && std::string(name(static_cast<Enum>(i))) != "?"; ++i)
    out += (out.empty() ? "" : ", ") + std::string(name(static_cast<Enum>(i)));
  return out;
}

// A key whose value is one of a fixed set of names: parsed into its enum once, here, when the config is read.
template <typename Enum>
Field named_field(const char* section, const char* key, Enum& ref, Enum (*parse)(const std::string&),
                  const char* (*name)(Enum)) {
  return {section, key,
          [&ref, parse](const toml::node& n, const std::string& where) {
            if (!n.is_string()) wrong_type(where, "a string", n);
            try {
              ref = parse(n.as_string()->get());
            } catch (const UsageError& e) {
              // Its message names the key and the choices; add where the value came from (file or --set).
              const auto origin = where.find(" (");
              throw UsageError(std::string(e.what()) + (origin == std::string::npos ? "" : where.substr(origin)));
            }
          },
          [&ref, name] {
            std::ostringstream out;
            out << toml::value<std::string>(name(ref));
            return out.str();
          },
          "one of " + names_of(name)};
}

Field bool_field(const char* section, const char* key, bool& ref) {
  return {section, key,
          [&ref](const toml::node& n, const std::string& where) {
            if (!n.is_boolean()) wrong_type(where, "true or false", n);
            ref = n.as_boolean()->get();
          },
          [&ref] { return std::string(ref ? "true" : "false"); },
          "true or false"};
}

// Adds each key a layer's visit_keys names (models/gpt_config.h, data/dataset.h, ...) to the table, as a Field of
// `section`: the layers declare their keys, this file knows TOML.
struct KeyAdder {
  std::vector<Field>& out;
  const char* section;
  void operator()(const char* key, int64_t& ref) { out.push_back(int_field(section, key, ref)); }
  void operator()(const char* key, uint64_t& ref) { out.push_back(uint_field(section, key, ref)); }
  void operator()(const char* key, double& ref) { out.push_back(double_field(section, key, ref)); }
  void operator()(const char* key, std::string& ref) { out.push_back(string_field(section, key, ref)); }
  void operator()(const char* key, bool& ref) { out.push_back(bool_field(section, key, ref)); }
  template <typename Enum>
  void operator()(const char* key, Enum& ref, Enum (*parse)(const std::string&), const char* (*name)(Enum)) {
    out.push_back(named_field(section, key, ref, parse, name));
  }
};

template <typename Section>
void add_keys(std::vector<Field>& out, const char* name, Section& section) {
  visit_keys(section, KeyAdder{out, name});
}

// The [run], [model] and [data] keys (fields() lists the others after them).
std::vector<Field> run_model_data_fields(Config& c) {
  std::vector<Field> all = {
      string_field("run", "name", c.run.name),
      string_field("run", "dir", c.run.dir),
      uint_field("run", "seed", c.run.seed),
      int_field("run", "log_every", c.run.log_every),
      string_field("run", "secret_file", c.run.secret_file),
      bool_field("run", "work_log", c.run.work_log),
  };
  add_keys(all, "model", c.model);
  all.push_back(string_field("model", "init_from", c.model_init_from));  // the run's, not the model shape's
  add_keys(all, "data", c.data);
  add_keys(all, "dlrm", c.dlrm);
  return all;
}

// The [train] keys.
std::vector<Field> train_fields(Config& c) {
  return {
      int_field("train", "steps", c.train.steps),
      int_field("train", "global_batch", c.train.global_batch),
      int_field("train", "micro_batches", c.train.micro_batches),
      double_field("train", "lr", c.train.lr),
      double_field("train", "min_lr", c.train.min_lr),
      int_field("train", "warmup_steps", c.train.warmup_steps),
      double_field("train", "weight_decay", c.train.weight_decay),
      double_field("train", "beta1", c.train.beta1),
      double_field("train", "beta2", c.train.beta2),
      double_field("train", "eps", c.train.eps),
      double_field("train", "grad_clip", c.train.grad_clip),
      int_field("train", "eval_every", c.train.eval_every),
      int_field("train", "eval_batches", c.train.eval_batches),
      int_field("train", "checkpoint_every", c.train.checkpoint_every),
      int_field("train", "keep_checkpoints", c.train.keep_checkpoints),
      bool_field("train", "async_checkpoint", c.train.async_checkpoint),
      int_field("train", "sample_tokens", c.train.sample_tokens),
      double_field("train", "peak_flops_per_rank", c.train.peak_flops_per_rank),
      int_field("train", "threads_per_rank", c.train.threads_per_rank),
      string_field("train", "precision", c.train.precision),
      string_field("train", "recompute", c.train.recompute),
      string_field("train", "freeze", c.train.freeze),
  };
}

// The [sync] and [elastic] keys.
std::vector<Field> sync_elastic_fields(Config& c) {
  return {
      named_field("sync", "mode", c.sync.mode, parse_sync_mode, to_string),
      int_field("sync", "clusters", c.sync.clusters),
      string_field("sync", "topology", c.sync.topology),
      bool_field("sync", "hierarchical", c.sync.hierarchical),
      int_field("sync", "inner_steps", c.sync.inner_steps),
      double_field("sync", "outer_lr", c.sync.outer_lr),
      double_field("sync", "outer_momentum", c.sync.outer_momentum),
      bool_field("sync", "nesterov", c.sync.nesterov),
      string_field("sync", "compression", c.sync.compression),
      int_field("sync", "fragments", c.sync.fragments),
      int_field("sync", "overlap_steps", c.sync.overlap_steps),
      string_field("sync", "cluster_batch", c.sync.cluster_batch),
      int_field("sync", "period", c.sync.period),
      int_field("sync", "staleness", c.sync.staleness),
      int_field("sync", "slow_rank", c.sync.slow_rank),
      double_field("sync", "slow_ms", c.sync.slow_ms),
      bool_field("elastic", "enabled", c.elastic.enabled),
      int_field("elastic", "heartbeat_ms", c.elastic.heartbeat_ms),
      int_field("elastic", "failure_timeout_ms", c.elastic.failure_timeout_ms),
      int_field("elastic", "min_replicas", c.elastic.min_replicas),
      int_field("elastic", "max_restarts", c.elastic.max_restarts),
  };
}

// The [debug] keys: switches for tests only.
std::vector<Field> debug_fields(Config& c) {
  return {
      int_field("debug", "fault_save_delay_ms", c.debug.checkpoint.save_delay_ms),
      bool_field("debug", "fault_commit_rename", c.debug.checkpoint.commit_rename),
      string_field("debug", "elastic_kill", c.debug.elastic_kill),
      string_field("debug", "elastic_stop", c.debug.elastic_stop),
      bool_field("debug", "elastic_digest", c.debug.elastic_digest),
      string_field("debug", "skip_collective", c.debug.skip_collective),
  };
}

void append(std::vector<Field>& all, std::vector<Field> more) {
  all.insert(all.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
}

// Every key, section by section, in the order config.toml lists them. The sections of a lower layer are its own
// (visit_keys beside the struct); [run], [train], [sync], [elastic] and [debug] are the train layer's.
std::vector<Field> fields(Config& c) {
  std::vector<Field> all = run_model_data_fields(c);
  append(all, train_fields(c));
  add_keys(all, "parallel", c.parallel);
  add_keys(all, "comm", c.comm);
  append(all, sync_elastic_fields(c));
  add_keys(all, "obs", c.obs);
  append(all, debug_fields(c));
  return all;
}

std::vector<std::string> sections(const std::vector<Field>& all) {
  std::vector<std::string> out;
  for (const auto& f : all)
    if (out.empty() || out.back() != f.section) out.push_back(f.section);
  return out;
}

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& i : items) out += (out.empty() ? "" : ", ") + i;
  return out;
}

// Single-character edits (insert, delete, substitute) from a to b.
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// What `section.key`, which is not a key, most likely meant: the same key in another section (train.log_every
// is run.log_every), else the nearest key (at most 2 edits) of the nearest section. "" when nothing is close.
std::string likely_key(const std::vector<Field>& all, const std::string& section, const std::string& key) {
  for (const auto& f : all)
    if (f.key == key && f.section != section) return f.section + "." + f.key;
  const Field* best = nullptr;
  size_t best_distance = 3;
  for (const auto& f : all) {
    const size_t d = edit_distance(f.section, section) + edit_distance(f.key, key);
    if (d < best_distance) best = &f, best_distance = d;
  }
  return best ? best->section + "." + best->key : "";
}

std::string did_you_mean(const std::vector<Field>& all, const std::string& section, const std::string& key) {
  const std::string likely = likely_key(all, section, key);
  return likely.empty() ? "" : "did you mean '" + likely + "'? ";
}

void set_key(std::vector<Field>& all, const std::string& section, const std::string& key, const toml::node& value,
             const std::string& origin) {
  std::vector<std::string> valid;
  bool section_known = false;
  for (auto& f : all) {
    if (f.section != section) continue;
    section_known = true;
    valid.push_back(f.key);
    if (f.key == key) {
      f.set(value, section + "." + key + " (" + origin + ")");
      return;
    }
  }
  const std::string hint = did_you_mean(all, section, key);
  if (!section_known)
    throw UsageError("unknown section [" + section + "] in " + origin + "; " + hint + "the sections are " +
                     join(sections(all)));
  throw UsageError("unknown key '" + section + "." + key + "' in " + origin + "; " + hint + "valid keys of [" +
                   section + "]: " + join(valid));
}

}  // namespace

void apply_override(Config& config, const std::string& assignment) {
  auto eq = assignment.find('=');
  auto dot = assignment.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq)
    throw UsageError("--set '" + assignment + "' must look like section.key=value, e.g. train.steps=30");
  const std::string section = assignment.substr(0, dot);
  const std::string key = assignment.substr(dot + 1, eq - dot - 1);
  const std::string text = assignment.substr(eq + 1);
  auto all = fields(config);
  // TOML syntax when it parses (numbers, quoted strings, booleans), otherwise a bare string.
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + text);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", text}};
  }
  set_key(all, section, key, *parsed.get("v"), "--set " + assignment);
}

namespace {

Config config_from_table(const toml::table& table, const std::string& origin) {
  Config config;
  auto all = fields(config);
  for (const auto& [section, node] : table) {
    const std::string name(section.str());
    if (!node.is_table()) {
      throw UsageError("'" + name + "' in " + origin + " must be a section [" + name + "]; the sections are " +
                       join(sections(all)));
    }
    for (const auto& [key, value] : *node.as_table()) set_key(all, name, std::string(key.str()), value, origin);
  }
  return config;
}

}  // namespace

Config load_config(const std::string& path, const std::vector<std::string>& overrides) {
  toml::table table;
  try {
    table = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    if (std::string(e.description()).find("File could not be opened") != std::string::npos)
      throw UsageError("cannot read config file '" + path + "'");
    throw UsageError("config file '" + path + "' line " + std::to_string(where.line) + ": " +
                     std::string(e.description()));
  }
  Config config = config_from_table(table, path);
  for (const auto& o : overrides) apply_override(config, o);
  check_ranges(config);
  return config;
}

void check_ranges(const Config& c) {
  // Each value is judged after the overrides, so the message names the key, not where it was set.
  auto need = [](bool ok, const std::string& key, double value, const std::string& rule) {
    if (ok) return;
    std::ostringstream v;
    v << std::setprecision(15) << value;  // whole numbers print whole (-1000000, not -1e+06)
    throw UsageError(key + " = " + v.str() + " " + rule);
  };
  need(c.run.log_every >= 1, "run.log_every", c.run.log_every, "must be at least 1");
  // The digest is of the gradient before the data-parallel reduction: ZeRO-2 and -3 reduce inside every
  // backward pass, so no such gradient exists there; the DLRM trainer has no work log.
  if (c.run.work_log && (c.parallel.zero >= 2 || c.model.arch == models::ModelArch::Dlrm))
    throw UsageError("run.work_log = true needs parallel.zero 0 or 1 and a GPT or Llama model (got parallel.zero = " +
                     std::to_string(c.parallel.zero) + ", model.arch = \"" + models::to_string(c.model.arch) +
                     "\"): its digests are of each step's gradient before reduction");
  need(c.model.dropout >= 0 && c.model.dropout < 1, "model.dropout", c.model.dropout, "must be in [0, 1)");
  need(c.data.val_fraction >= 0 && c.data.val_fraction < 1, "data.val_fraction", c.data.val_fraction,
       "must be in [0, 1)");
  need(c.train.steps >= 1, "train.steps", c.train.steps, "must be at least 1");
  need(c.train.global_batch >= 1, "train.global_batch", c.train.global_batch,
       "must be at least 1 (sequences per optimizer step, over all data-parallel ranks)");
  need(c.train.micro_batches >= 1, "train.micro_batches", c.train.micro_batches, "must be at least 1");
  need(c.train.lr > 0, "train.lr", c.train.lr, "must be positive");
  need(c.train.min_lr >= 0, "train.min_lr", c.train.min_lr, "must be 0 or more");
  need(c.train.warmup_steps >= 0, "train.warmup_steps", c.train.warmup_steps, "must be 0 (no warm-up) or more");
  need(c.train.weight_decay >= 0, "train.weight_decay", c.train.weight_decay, "must be 0 or more");
  need(c.train.beta1 >= 0 && c.train.beta1 < 1, "train.beta1", c.train.beta1, "must be in [0, 1)");
  need(c.train.beta2 >= 0 && c.train.beta2 < 1, "train.beta2", c.train.beta2, "must be in [0, 1)");
  need(c.train.eps > 0, "train.eps", c.train.eps, "must be positive");
  need(c.train.grad_clip >= 0, "train.grad_clip", c.train.grad_clip, "must be 0 (no clipping) or more");
  need(c.train.eval_every >= 0, "train.eval_every", c.train.eval_every, "must be 0 (no validation) or more");
  need(c.train.eval_batches >= 1, "train.eval_batches", c.train.eval_batches, "must be at least 1");
  need(c.train.checkpoint_every >= 0, "train.checkpoint_every", c.train.checkpoint_every,
       "must be 0 (a checkpoint at the end only) or more");
  need(c.train.keep_checkpoints >= 0, "train.keep_checkpoints", c.train.keep_checkpoints, "must be 0 (keep all) or more");
  need(c.train.sample_tokens >= 0, "train.sample_tokens", c.train.sample_tokens, "must be 0 (no sample) or more");
  need(c.train.peak_flops_per_rank >= 0, "train.peak_flops_per_rank", c.train.peak_flops_per_rank,
       "must be 0 (measure it) or more");
  need(c.train.threads_per_rank >= 1, "train.threads_per_rank", c.train.threads_per_rank, "must be at least 1");
  need(c.parallel.bucket_mb > 0, "parallel.bucket_mb", c.parallel.bucket_mb, "must be positive");
  need(c.comm.timeout_s > 0, "comm.timeout_s", c.comm.timeout_s,
       "must be positive: the seconds a collective may wait for a peer before the run fails");
  // Waits are timeout_s * 1000 milliseconds in an int64 added to now(): a bound keeps that arithmetic defined,
  // and a week is longer than any step should wait.
  need(c.comm.timeout_s <= 604800, "comm.timeout_s", c.comm.timeout_s,
       "must be at most 604800 (7 days): the seconds a collective may wait for a peer before the run fails");
  need(c.obs.trace_flush_every >= 1, "obs.trace_flush_every", c.obs.trace_flush_every, "must be at least 1");
  need(c.obs.trace_buffer_events >= 1000, "obs.trace_buffer_events", c.obs.trace_buffer_events,
       "must be at least 1000");
  need(c.obs.flight_records >= 1, "obs.flight_records", c.obs.flight_records, "must be at least 1");
  need(c.obs.straggler_every >= 0, "obs.straggler_every", c.obs.straggler_every, "must be 0 (off) or more");
  need(c.obs.straggler_margin > 0, "obs.straggler_margin", c.obs.straggler_margin,
       "must be positive: the fraction by which a straggler's busy time exceeds the median");
  need(c.obs.straggler_min_ms >= 0, "obs.straggler_min_ms", c.obs.straggler_min_ms, "must be 0 or more");
  need(c.obs.straggler_windows >= 1, "obs.straggler_windows", c.obs.straggler_windows, "must be at least 1");
  need(c.obs.metrics_port >= 0 && c.obs.metrics_port <= 65535, "obs.metrics_port", c.obs.metrics_port,
       "must be a TCP port (1-65535), or 0 for no metrics endpoint");
  // Malformed debug specs are refused before any rank starts (each rank would refuse it again).
  parse_debug_fault(c.debug.elastic_kill, "elastic_kill");
  parse_debug_fault(c.debug.elastic_stop, "elastic_stop");
  parse_debug_fault(c.debug.skip_collective, "skip_collective");
  need(c.debug.checkpoint.save_delay_ms >= 0, "debug.fault_save_delay_ms", c.debug.checkpoint.save_delay_ms,
       "must be 0 (no delay) or more");
  check_cluster_batch(c);
  if (c.model.arch == models::ModelArch::Dlrm) recsys::check_dlrm(c.dlrm);
}

std::vector<int64_t> parse_cluster_batch(const std::string& text) {
  std::vector<int64_t> counts;
  if (text.empty()) return counts;
  const std::string usage = "sync.cluster_batch = \"" + text +
                            "\" must be positive sequence counts, one per cluster, like \"24,8\" (or \"\" for an "
                            "even split)";
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    size_t used = 0;
    int64_t n = 0;
    try {
      n = std::stoll(item, &used);
    } catch (const std::logic_error&) {
      throw UsageError(usage);
    }
    if (n < 1 || item.find_first_not_of(' ', used) != std::string::npos) throw UsageError(usage);
    counts.push_back(n);
  }
  if (counts.empty() || text.back() == ',') throw UsageError(usage);
  return counts;
}

void check_cluster_batch(const Config& c) {
  const std::vector<int64_t> counts = parse_cluster_batch(c.sync.cluster_batch);
  if (counts.empty()) return;
  const std::string key = "sync.cluster_batch = \"" + c.sync.cluster_batch + "\"";
  if (c.sync.mode != SyncMode::DiLoCo)
    throw UsageError(key + " needs sync.mode = \"diloco\" (clusters that meet only at outer steps); got \"" +
                     to_string(c.sync.mode) + "\": set sync.mode = \"diloco\" or sync.cluster_batch = \"\"");
  int64_t sum = 0;
  for (int64_t n : counts) sum += n;
  if (sum != c.train.global_batch)
    throw UsageError(key + " adds up to " + std::to_string(sum) + " sequences but train.global_batch = " +
                     std::to_string(c.train.global_batch) + "; make them equal");
  if (c.sync.clusters > 0 && static_cast<int64_t>(counts.size()) != c.sync.clusters)
    throw UsageError(key + " gives " + std::to_string(counts.size()) + " counts for sync.clusters = " +
                     std::to_string(c.sync.clusters) + "; give one per cluster");
}

Config parse_config(const std::string& text, const std::string& origin) {
  toml::table table;
  try {
    table = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    throw UsageError("config in " + origin + " line " + std::to_string(e.source().begin.line) + ": " +
                     std::string(e.description()));
  }
  return config_from_table(table, origin);
}

std::string describe_config(const Config& config) {
  Config current = config, defaults;
  const std::vector<Field> now = fields(current), initial = fields(defaults);
  std::ostringstream out;
  std::string section;
  for (size_t i = 0; i < now.size(); ++i) {
    const Field& f = now[i];
    if (f.section != section) {
      out << (section.empty() ? "" : "\n") << "[" << f.section << "]\n";
      section = f.section;
    }
    const std::string line = f.key + " = " + f.show();
    const std::string was = initial[i].show();
    out << line << std::string(line.size() < 40 ? 40 - line.size() : 1, ' ') << "# " << f.type
        << (was == f.show() ? "" : "; default " + was) << "\n";
  }
  return out.str();
}

std::string to_toml(const Config& const_config) {
  Config config = const_config;
  std::ostringstream out;
  std::string section;
  for (const auto& f : fields(config)) {
    if (f.section != section) {
      out << (section.empty() ? "" : "\n") << "[" << f.section << "]\n";
      section = f.section;
    }
    out << f.key << " = " << f.show() << "\n";
  }
  return out.str();
}

}  // namespace crosstrain::train
