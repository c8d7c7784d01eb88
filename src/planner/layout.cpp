#include "crosstrain/planner/layout.h"

#include <sstream>

#include "crosstrain/core/error.h"

namespace crosstrain::planner {
namespace {

std::string join(const std::vector<int64_t>& values) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) out += (i ? "," : "") + std::to_string(values[i]);
  return out;
}

// "1" or "0.5": the shortest form that reads back the same.
std::string number(double v) {
  std::ostringstream s;
  s << v;
  return s.str();
}

// The sync keys of `scope`. The trainer's modes are not the layout's: DiLoCo is sync.mode = "diloco" with its
// inner steps, Hierarchical is sync.mode = "sync" with sync.hierarchical. The scheduler's scope leaves sync.mode to
// the recipe unless the layout needs DiLoCo: a plain Sync adds nothing (one cluster keeps the recipe's mode) and
// Hierarchical only its flag.
void add_sync(const Layout& l, OverrideScope scope, std::vector<std::string>& o) {
  const bool whole = scope == OverrideScope::WholeRun;
  switch (l.sync) {
    case LayoutSync::Sync:
      if (whole) o.push_back("sync.mode=sync");
      return;
    case LayoutSync::Hierarchical:
      if (whole) o.push_back("sync.mode=sync");
      o.push_back("sync.hierarchical=true");
      return;
    case LayoutSync::DiLoCo:
      o.push_back("sync.mode=diloco");
      o.push_back("sync.inner_steps=" + std::to_string(l.inner_steps));
      return;
  }
}

}  // namespace

LayoutSync parse_layout_sync(const std::string& name) {
  for (LayoutSync s : kLayoutSyncs)
    if (name == to_string(s)) return s;
  throw UsageError("layout sync '" + name + "' is not known; use sync, hierarchical or diloco");
}

const char* to_string(LayoutSync sync) {
  switch (sync) {
    case LayoutSync::Sync: return "sync";
    case LayoutSync::Hierarchical: return "hierarchical";
    case LayoutSync::DiLoCo: return "diloco";
  }
  return "?";
}

std::string Layout::describe() const {
  std::ostringstream s;
  s << "dp=" << dp << " tp=" << tp << " pp=" << pp << " zero=" << zero;
  if (pp > 1) {
    s << " " << parallel::to_string(schedule);
    if (chunks > 1) s << " v=" << chunks;
  }
  s << " m=" << microbatches << " mb=" << micro_batch;
  if (sequence_parallel) s << " sp";
  if (recompute != "none") s << " recompute=" << recompute;
  s << " " << precision << " " << to_string(sync);
  if (sync == LayoutSync::DiLoCo) s << " H=" << inner_steps;
  if (!stage_layers.empty()) s << " stages=" << join(stage_layers);
  if (!cluster_batch.empty()) s << " cluster_batch=" << join(cluster_batch);
  return s.str();
}

std::vector<std::string> Layout::train_overrides(OverrideScope scope) const {
  std::vector<std::string> o;
  if (scope == OverrideScope::ShapeAndSync) {
    o = {"parallel.tp=" + std::to_string(tp), "parallel.pp=" + std::to_string(pp),
         "parallel.zero=" + std::to_string(zero)};
    add_sync(*this, scope, o);
    return o;
  }
  o = {
      "parallel.dp=" + std::to_string(dp),
      "parallel.tp=" + std::to_string(tp),
      "parallel.pp=" + std::to_string(pp),
      "parallel.zero=" + std::to_string(zero),
      "parallel.schedule=" + std::string(parallel::to_string(schedule)),
      "parallel.chunks=" + std::to_string(chunks),
      "parallel.sequence_parallel=" + std::string(sequence_parallel ? "true" : "false"),
      "train.global_batch=" + std::to_string(global_batch()),
      "train.micro_batches=" + std::to_string(microbatches),
      "train.precision=" + precision,
      "train.recompute=" + recompute,
      "parallel.bucket_mb=" + number(bucket_mb),
  };
  add_sync(*this, scope, o);
  if (!stage_layers.empty()) o.push_back("parallel.stage_layers=\"" + join(stage_layers) + "\"");
  // The trainer's per-cluster batch (DiLoCo): each cluster's sequences per step, in cluster order.
  if (!cluster_batch.empty()) o.push_back("sync.cluster_batch=\"" + join(cluster_batch) + "\"");
  return o;
}

namespace {

int64_t whole(const std::string& word, const std::string& value) {
  size_t used = 0;
  long long v = -1;
  try {
    v = std::stoll(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || v < 0)
    throw UsageError("layout word '" + word + "': '" + value + "' is not a whole number >= 0");
  return v;
}

double positive(const std::string& word, const std::string& value) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value.size() || !(v > 0))
    throw UsageError("layout word '" + word + "': '" + value + "' is not a number > 0");
  return v;
}

std::vector<int64_t> counts(const std::string& word, const std::string& value) {
  std::vector<int64_t> out;
  std::stringstream s(value);
  for (std::string part; std::getline(s, part, ',');) out.push_back(whole(word, part));
  return out;
}

// Words without '=': flags and bare names.
bool apply_flag(Layout& l, const std::string& w) {
  if (w == "sp") return l.sequence_parallel = true;
  if (w == "bf16" || w == "fp32") return l.precision = w, true;
  for (LayoutSync s : kLayoutSyncs)
    if (w == to_string(s)) return l.sync = s, true;
  for (const char* s : {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2"})
    if (w == s) return l.schedule = parallel::parse_schedule(w), true;
  return false;
}

void apply_word(Layout& l, const std::string& w) {
  const auto eq = w.find('=');
  if (eq == std::string::npos) {
    if (!apply_flag(l, w))
      throw UsageError("layout word '" + w + "' is not understood; use e.g. \"dp=8 tp=8 pp=16 zero=1 1f1b m=192 mb=1 "
                       "sp recompute=full bf16 sync\"");
    return;
  }
  const std::string k = w.substr(0, eq), v = w.substr(eq + 1);
  auto i = [&] { return static_cast<int>(whole(w, v)); };
  if (k == "dp") l.dp = i();
  else if (k == "tp") l.tp = i();
  else if (k == "pp") l.pp = i();
  else if (k == "zero") l.zero = i();
  else if (k == "v" || k == "chunks") l.chunks = i();
  else if (k == "m" || k == "microbatches") l.microbatches = i();
  else if (k == "mb" || k == "micro_batch") l.micro_batch = i();
  else if (k == "H" || k == "inner_steps") l.inner_steps = i();
  else if (k == "schedule") l.schedule = parallel::parse_schedule(v);
  else if (k == "recompute") l.recompute = v;
  else if (k == "precision") l.precision = v;
  else if (k == "sync") l.sync = parse_layout_sync(v);
  else if (k == "sp" || k == "sequence_parallel") l.sequence_parallel = v == "true" || v == "1";
  else if (k == "stages" || k == "stage_layers") l.stage_layers = counts(w, v);
  else if (k == "cluster_batch") l.cluster_batch = counts(w, v);
  else if (k == "bucket_mb") l.bucket_mb = positive(w, v);
  else throw UsageError("layout key '" + k + "' is not known (dp, tp, pp, zero, schedule, v, m, mb, sp, recompute, "
                        "precision, sync, H, stages, cluster_batch)");
}

}  // namespace

Layout parse_layout(const std::string& text) {
  Layout l;
  l.dp = 0;
  std::stringstream s(text);
  for (std::string word; s >> word;) apply_word(l, word);
  if (l.schedule == parallel::ScheduleKind::Interleaved1F1B && l.chunks == 1) l.chunks = 2;
  return l;
}

}  // namespace crosstrain::planner
