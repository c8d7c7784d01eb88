#include "crosstrain/train/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <iomanip>
#include <sstream>
#include <stdexcept>

#include "crosstrain/core/error.h"
#include "crosstrain/core/names.h"
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
  std::string help;  // one line: what the key does (crosstrain config, docs/config-reference.md)
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

Field int_field(const char* section, const char* key, int64_t& ref, const char* help) {
  return {section, key,
          [&ref](const toml::node& n, const std::string& where) {
            if (!n.is_integer()) wrong_type(where, "an integer", n);
            ref = n.as_integer()->get();
          },
          [&ref] { return std::to_string(ref); },
          "integer", help};
}

Field uint_field(const char* section, const char* key, uint64_t& ref, const char* help) {
  return {section, key,
          [&ref](const toml::node& n, const std::string& where) {
            if (!n.is_integer() || n.as_integer()->get() < 0) wrong_type(where, "a non-negative integer", n);
            ref = static_cast<uint64_t>(n.as_integer()->get());
          },
          [&ref] { return std::to_string(ref); },
          "integer >= 0", help};
}

// The shortest decimal that reads back as exactly `value` (0.1, not 0.10000000000000001), as a TOML float.
std::string shortest_number(double value) {
  char text[32];
  int digits = 1;
  for (; digits < 17; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, value);
    if (std::strtod(text, nullptr) == value) break;
  }
  // Whole numbers up to 16 digits in full (10000.0, not 1e+04): %g writes an exponent once it has more digits
  // than its precision.
  const double magnitude = std::fabs(value);
  if (magnitude >= 1 && magnitude < 1e16) digits = std::max(digits, 1 + static_cast<int>(std::log10(magnitude)));
  std::snprintf(text, sizeof text, "%.*g", digits, value);
  std::string out = text;
  if (out.find_first_of(".e") == std::string::npos) out += ".0";  // 10000.0: a float, not an integer
  return out;
}

Field double_field(const char* section, const char* key, double& ref, const char* help) {
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
          [&ref] { return shortest_number(ref); },
          "number", help};
}

Field string_field(const char* section, const char* key, std::string& ref, const char* help) {
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
          "string", help};
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
                  const char* (*name)(Enum), const char* help) {
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
          "one of " + names_of(name), help};
}

Field bool_field(const char* section, const char* key, bool& ref, const char* help) {
  return {section, key,
          [&ref](const toml::node& n, const std::string& where) {
            if (!n.is_boolean()) wrong_type(where, "true or false", n);
            ref = n.as_boolean()->get();
          },
          [&ref] { return std::string(ref ? "true" : "false"); },
          "true or false", help};
}

// Adds each key a layer's visit_keys names (models/gpt_config.h, data/dataset.h, ...) to the table, as a Field of
// `section`: the layers declare their keys, this file knows TOML.
struct KeyAdder {
  std::vector<Field>& out;
  const char* section;
  void operator()(const char* key, int64_t& ref, const char* help) { out.push_back(int_field(section, key, ref, help)); }
  void operator()(const char* key, uint64_t& ref, const char* help) {
    out.push_back(uint_field(section, key, ref, help));
  }
  void operator()(const char* key, double& ref, const char* help) {
    out.push_back(double_field(section, key, ref, help));
  }
  void operator()(const char* key, std::string& ref, const char* help) {
    out.push_back(string_field(section, key, ref, help));
  }
  void operator()(const char* key, bool& ref, const char* help) { out.push_back(bool_field(section, key, ref, help)); }
  template <typename Enum>
  void operator()(const char* key, Enum& ref, Enum (*parse)(const std::string&), const char* (*name)(Enum),
                  const char* help) {
    out.push_back(named_field(section, key, ref, parse, name, help));
  }
};

template <typename Section>
void add_keys(std::vector<Field>& out, const char* name, Section& section) {
  visit_keys(section, KeyAdder{out, name});
}

// The [run], [model] and [data] keys (fields() lists the others after them).
std::vector<Field> run_model_data_fields(Config& c) {
  std::vector<Field> all = {
      string_field("run", "name", c.run.name,
                 "the run's name in logs, traces and reports"),
      string_field("run", "dir", c.run.dir,
                 "where the resolved config, metrics.jsonl, traces and checkpoints/ go"),
      uint_field("run", "seed", c.run.seed,
                 "seed of the initial weights and of the data order"),
      int_field("run", "log_every", c.run.log_every,
                 "steps between progress lines (metrics.jsonl gets every step)"),
      string_field("run", "secret_file", c.run.secret_file,
                 "a file (mode 0600) holding the job secret peers must prove; CROSSTRAIN_SECRET takes precedence"),
      bool_field("run", "work_log", c.run.work_log,
                 "write RUN_DIR/work/cluster<K>.jsonl for ledger claims"),
      string_field("run", "site", c.run.site,
                 "the storage run.dir is on: ranks of different sites share no file system, and every site gets "
                 "each checkpoint whole over the job's connections (\"\": one shared file system)"),
      string_field("run", "fence", c.run.fence,
                 "set by the scheduler: the placement that owns run.dir; a checkpoint commits only while RUN_DIR/FENCE "
                 "names it (\"\": no fencing)"),
  };
  add_keys(all, "model", c.model);
  all.push_back(string_field("model", "init_from", c.model_init_from,
                 "start from these weights: a Hugging Face folder or a crosstrain checkpoint (\"\": seeded init)"));  // the run's, not the model shape's
  add_keys(all, "data", c.data);
  add_keys(all, "dlrm", c.dlrm);
  return all;
}

// The [train] keys.
std::vector<Field> train_fields(Config& c) {
  return {
      int_field("train", "steps", c.train.steps,
                 "optimizer steps of the run"),
      int_field("train", "global_batch", c.train.global_batch,
                 "sequences per optimizer step, over all data-parallel ranks"),
      int_field("train", "micro_batches", c.train.micro_batches,
                 "micro-batches per step and data-parallel rank: gradient accumulation, and a pipeline's micro-batches (at least parallel.pp)"),
      double_field("train", "lr", c.train.lr,
                 "peak learning rate (after warm-up; cosine decay to min_lr)"),
      double_field("train", "min_lr", c.train.min_lr,
                 "learning rate at the last step"),
      int_field("train", "warmup_steps", c.train.warmup_steps,
                 "steps of linear warm-up from 0 to lr"),
      double_field("train", "weight_decay", c.train.weight_decay,
                 "AdamW decoupled weight decay"),
      double_field("train", "beta1", c.train.beta1,
                 "AdamW first-moment decay"),
      double_field("train", "beta2", c.train.beta2,
                 "AdamW second-moment decay"),
      double_field("train", "eps", c.train.eps,
                 "AdamW epsilon"),
      double_field("train", "grad_clip", c.train.grad_clip,
                 "clip the global gradient norm to this; 0: no clipping"),
      int_field("train", "eval_every", c.train.eval_every,
                 "steps between validation losses; 0: none"),
      int_field("train", "eval_batches", c.train.eval_batches,
                 "batches per validation"),
      int_field("train", "checkpoint_every", c.train.checkpoint_every,
                 "steps between checkpoints; 0: only at the end (and when stopped)"),
      int_field("train", "keep_checkpoints", c.train.keep_checkpoints,
                 "the newest K complete checkpoints are kept; 0: all"),
      bool_field("train", "async_checkpoint", c.train.async_checkpoint,
                 "write checkpoints on a background thread while training goes on"),
      int_field("train", "sample_tokens", c.train.sample_tokens,
                 "tokens generated by rank 0 at the end; 0: no sample"),
      double_field("train", "peak_flops_per_rank", c.train.peak_flops_per_rank,
                 "the peak behind MFU; 0: time this rank's GEMMs at the model's shapes"),
      int_field("train", "threads_per_rank", c.train.threads_per_rank,
                 "compute threads of each rank"),
      string_field("train", "precision", c.train.precision,
                 "fp32, or bf16 (bf16 parameters and gradients, fp32 master weights)"),
      string_field("train", "recompute", c.train.recompute,
                 "activations redone in backward: none, selective (attention core) or full (whole blocks)"),
      string_field("train", "freeze", c.train.freeze,
                 "parameters kept fixed: embedding, head, block ranges like \"0-5\", or all (\"\": none; all but LoRA with lora_rank)"),
  };
}

// The [sync] and [elastic] keys.
std::vector<Field> sync_elastic_fields(Config& c) {
  return {
      named_field("sync", "mode", c.sync.mode, parse_sync_mode, to_string,
                  "how replicas agree: sync (every step), diloco, ssp, async or gossip"),
      int_field("sync", "clusters", c.sync.clusters,
                 "clusters of consecutive ranks; 0: from sync.topology or CROSSTRAIN_CLUSTER, else 1"),
      string_field("sync", "topology", c.sync.topology,
                 "a topology TOML (hosts and their clusters): each rank finds its host's cluster"),
      bool_field("sync", "hierarchical", c.sync.hierarchical,
                 "sync: all-reduce inside each cluster, then across clusters"),
      int_field("sync", "inner_steps", c.sync.inner_steps,
                 "diloco: inner steps H between outer steps"),
      double_field("sync", "outer_lr", c.sync.outer_lr,
                 "diloco: outer SGD learning rate"),
      double_field("sync", "outer_momentum", c.sync.outer_momentum,
                 "diloco: outer momentum"),
      bool_field("sync", "nesterov", c.sync.nesterov,
                 "diloco: Nesterov outer momentum"),
      string_field("sync", "compression", c.sync.compression,
                 "diloco outer gradients: none, bf16, fp16, int8, int4, ..."),
      int_field("sync", "fragments", c.sync.fragments,
                 "streaming diloco: parameter fragments synced on a staggered schedule; 1: all at once"),
      int_field("sync", "overlap_steps", c.sync.overlap_steps,
                 "streaming diloco: inner steps a fragment's exchange overlaps"),
      string_field("sync", "cluster_batch", c.sync.cluster_batch,
                 "diloco: sequences per step of each cluster, e.g. \"24,8\" (adds up to train.global_batch); \"\": even"),
      string_field("sync", "cluster_ranks", c.sync.cluster_ranks,
                 "diloco: data-parallel ranks of each cluster in rank order, e.g. \"2,1,1\"; \"\": sync.clusters blocks"),
      int_field("sync", "period", c.sync.period,
                 "gossip, async, ssp: steps between exchanges"),
      int_field("sync", "staleness", c.sync.staleness,
                 "ssp: steps a rank may run ahead of the slowest"),
      int_field("sync", "slow_rank", c.sync.slow_rank,
                 "experiments: this rank sleeps slow_ms every step; -1: none"),
      double_field("sync", "slow_ms", c.sync.slow_ms,
                 "experiments: the slow rank's extra milliseconds per step"),
      bool_field("elastic", "enabled", c.elastic.enabled,
                 "survive failures and joins (also --max-restarts, --nnodes MIN:MAX)"),
      int_field("elastic", "heartbeat_ms", c.elastic.heartbeat_ms,
                 "each rank's heartbeat period"),
      int_field("elastic", "failure_timeout_ms", c.elastic.failure_timeout_ms,
                 "a rank silent this long is dead and its replica leaves"),
      int_field("elastic", "min_replicas", c.elastic.min_replicas,
                 "train on while at least this many replicas are live"),
      int_field("elastic", "max_restarts", c.elastic.max_restarts,
                 "the launcher restarts failed ranks this many times in all"),
      bool_field("elastic", "join_at_outer_steps", c.elastic.join_at_outer_steps,
                 "diloco: take a joining cluster in right after an outer step, not at the next step"),
      string_field("elastic", "overlap_votes", c.elastic.overlap_votes,
                 "auto, always or never: cast each step's vote while the next step computes (always: replicas of "
                 "several ranks keep a copy of the state to go back to; auto: only where no copy is needed)"),
  };
}

// The [debug] keys: switches for tests only.
std::vector<Field> debug_fields(Config& c) {
  return {
      int_field("debug", "fault_save_delay_ms", c.debug.checkpoint.save_delay_ms,
                 "tests: every checkpoint save takes this much longer"),
      bool_field("debug", "fault_commit_rename", c.debug.checkpoint.commit_rename,
                 "tests: the checkpoint's final rename fails"),
      string_field("debug", "elastic_kill", c.debug.elastic_kill,
                 "tests: \"RANK@STEP\" (or all@STEP) sends itself SIGKILL in that step"),
      string_field("debug", "elastic_kill_at_vote", c.debug.elastic_kill_at_vote,
                 "tests: \"RANK@STEP\" (or all@STEP) sends itself SIGKILL once its gradients are reduced, before its vote"),
      string_field("debug", "elastic_kill_at_outputs", c.debug.elastic_kill_at_outputs,
                 "tests: \"RANK@STEP\" (or all@STEP) sends itself SIGKILL after that step's update, before its outputs"),
      string_field("debug", "elastic_kill_heal", c.debug.elastic_kill_heal,
                 "tests: \"RANK@N\": restarted processes 1 to N of that rank die while they heal"),
      string_field("debug", "elastic_stop", c.debug.elastic_stop,
                 "tests: \"RANK@STEP\" (or all@STEP) sends itself SIGSTOP in that step"),
      bool_field("debug", "elastic_digest", c.debug.elastic_digest,
                 "tests: print each rank's state digest when a generation starts"),
      string_field("debug", "skip_collective", c.debug.skip_collective,
                 "tests: \"RANK@STEP\" (or all@STEP) holds back its first collective of that step"),
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

// Keys that configs of earlier versions may still hold, and what they became. Recipes copied from ours hold the key
// at its old default, which meant "not set": that value is read as nothing. Any other value in a recipe or --set is
// refused, naming the new key. A config a checkpoint or run folder saved (parse_config) is carried over instead, as
// it meant then, so that what was saved still loads.
struct RenamedKey {
  const char *section, *key, *now, *why;
  int64_t old_default;
  void (*carry)(Config&, int64_t);  // sets the new key from an old value
};
constexpr RenamedKey kRenamedKeys[] = {
    {"parallel", "microbatches", "train.micro_batches",
     "one count of micro-batches per step, for gradient accumulation and pipelines alike", 0,
     // The old key, when set, took precedence over train.micro_batches.
     [](Config& c, int64_t value) { c.train.micro_batches = value; }},
};

// The entry of section.key when it is a renamed key; else null.
const RenamedKey* renamed_key(const std::string& section, const std::string& key) {
  for (const auto& renamed : kRenamedKeys)
    if (section == renamed.section && key == renamed.key) return &renamed;
  return nullptr;
}

bool at_old_default(const RenamedKey& renamed, const toml::node& value) {
  return value.is_integer() && value.as_integer()->get() == renamed.old_default;
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
  if (const RenamedKey* renamed = renamed_key(section, key)) {
    if (at_old_default(*renamed, value)) return;
    throw UsageError("'" + section + "." + key + "' in " + origin + " is now " + renamed->now + " (" + renamed->why +
                     "); set that instead");
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

// `saved`: a config crosstrain wrote (a checkpoint's, a run folder's), whose renamed keys carry over.
Config config_from_table(const toml::table& table, const std::string& origin, bool saved) {
  Config config;
  auto all = fields(config);
  std::vector<std::pair<const RenamedKey*, int64_t>> carried;
  for (const auto& [section, node] : table) {
    const std::string name(section.str());
    if (!node.is_table()) {
      throw UsageError("'" + name + "' in " + origin + " must be a section [" + name + "]; the sections are " +
                       join(sections(all)));
    }
    for (const auto& [key, value] : *node.as_table()) {
      const RenamedKey* renamed = renamed_key(name, std::string(key.str()));
      if (saved && renamed && value.is_integer() && !at_old_default(*renamed, value))
        carried.emplace_back(renamed, value.as_integer()->get());
      else
        set_key(all, name, std::string(key.str()), value, origin);
    }
  }
  for (const auto& [renamed, value] : carried) renamed->carry(config, value);
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
  Config config = config_from_table(table, path, /*saved=*/false);
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
  if (!c.run.site.empty() && !is_valid_name(c.run.site))
    throw UsageError("run.site = \"" + c.run.site +
                     "\" is not a name: 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit");
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
  if (c.elastic.overlap_votes != "auto" && c.elastic.overlap_votes != "always" && c.elastic.overlap_votes != "never")
    throw UsageError("elastic.overlap_votes = \"" + c.elastic.overlap_votes.substr(0, 40) +
                     "\" is not a choice: use \"auto\", \"always\" or \"never\"");
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
  parse_debug_fault(c.debug.elastic_kill_heal, "elastic_kill_heal");
  parse_debug_fault(c.debug.elastic_kill_at_vote, "elastic_kill_at_vote");
  parse_debug_fault(c.debug.elastic_kill_at_outputs, "elastic_kill_at_outputs");
  parse_debug_fault(c.debug.skip_collective, "skip_collective");
  need(c.debug.checkpoint.save_delay_ms >= 0, "debug.fault_save_delay_ms", c.debug.checkpoint.save_delay_ms,
       "must be 0 (no delay) or more");
  check_cluster_batch(c);
  check_cluster_ranks(c);
  if (c.model.arch == models::ModelArch::Dlrm) recsys::check_dlrm(c.dlrm);
}

namespace {

// "24,8" -> {24, 8}; `usage` names the key when an item is not a positive integer.
std::vector<int64_t> parse_counts(const std::string& text, const std::string& usage) {
  std::vector<int64_t> counts;
  if (text.empty()) return counts;
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

}  // namespace

std::vector<int64_t> parse_cluster_batch(const std::string& text) {
  return parse_counts(text, "sync.cluster_batch = \"" + text +
                                "\" must be positive sequence counts, one per cluster, like \"24,8\" (or \"\" for an "
                                "even split)");
}

std::vector<int64_t> parse_cluster_ranks(const std::string& text) {
  return parse_counts(text, "sync.cluster_ranks = \"" + text +
                                "\" must be positive rank counts, one per cluster in rank order, like \"2,1,1\" (or "
                                "\"\" for sync.clusters equal blocks)");
}

void check_cluster_ranks(const Config& c) {
  const std::vector<int64_t> ranks = parse_cluster_ranks(c.sync.cluster_ranks);
  if (ranks.empty()) return;
  const std::string key = "sync.cluster_ranks = \"" + c.sync.cluster_ranks + "\"";
  if (c.sync.mode != SyncMode::DiLoCo)
    throw UsageError(key + " needs sync.mode = \"diloco\" (clusters of different sizes meet only at outer steps); got \"" +
                     to_string(c.sync.mode) + "\"");
  if (c.sync.clusters > 0 && static_cast<int64_t>(ranks.size()) != c.sync.clusters)
    throw UsageError(key + " gives " + std::to_string(ranks.size()) + " clusters but sync.clusters = " +
                     std::to_string(c.sync.clusters) + "; give one count per cluster or set sync.clusters = 0");
  const std::vector<int64_t> batch = parse_cluster_batch(c.sync.cluster_batch);
  if (!batch.empty() && batch.size() != ranks.size())
    throw UsageError(key + " gives " + std::to_string(ranks.size()) + " clusters but sync.cluster_batch = \"" +
                     c.sync.cluster_batch + "\" " + std::to_string(batch.size()) + "; give one count per cluster in both");
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
  return config_from_table(table, origin, /*saved=*/true);
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
    out << line << std::string(line.size() < 40 ? 40 - line.size() : 1, ' ') << "# " << f.help << " [" << f.type
        << "; default " << initial[i].show() << "]\n";
  }
  return out.str();
}

namespace {

// A table cell of Markdown: '|' would end the cell.
std::string cell(const std::string& text) {
  std::string out;
  for (char c : text) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

}  // namespace

std::string config_reference() {
  Config defaults;
  std::ostringstream out;
  out << "# Configuration reference\n\n"
      << "Every key of a run's config, section by section: what it takes, its default and what it does. A recipe "
         "(TOML) sets\nany of them, `--set section.key=value` overrides one, and `crosstrain config RECIPE [--set ...]` "
         "prints the\nresolved config of a run with these same lines. This page is generated from the table the "
         "config reader uses\n(`crosstrain config --reference > docs/config-reference.md`; a test keeps it current).\n";
  std::string section;
  for (const Field& f : fields(defaults)) {
    if (f.section != section) {
      out << "\n## [" << f.section << "]\n\n| key | takes | default | what it does |\n|---|---|---|---|\n";
      section = f.section;
    }
    out << "| `" << f.key << "` | " << cell(f.type) << " | `" << cell(f.show()) << "` | " << cell(f.help) << " |\n";
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
