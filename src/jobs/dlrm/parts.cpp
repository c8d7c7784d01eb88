#include "parts.h"

#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>

#include "crosstrain/core/error.h"
#include "crosstrain/obs/trace.h"

#include <algorithm>

namespace crosstrain::train {

BatchTensors to_tensors(const data::CtrBatch& b, int64_t dense_features) {
  BatchTensors t;
  if (static_cast<int64_t>(b.dense.size()) != b.size * dense_features)
    throw Error("dlrm: a batch of " + std::to_string(b.size) + " examples has " + std::to_string(b.dense.size()) +
                " dense values, expected " + std::to_string(dense_features) + " each");
  t.dense = at::from_blob(const_cast<float*>(b.dense.data()), {b.size, dense_features}, at::kFloat).clone();
  t.labels = at::from_blob(const_cast<float*>(b.labels.data()), {b.size}, at::kFloat).clone();
  for (size_t k = 0; k < b.ids.size(); ++k) {
    t.ids.push_back(at::from_blob(const_cast<int64_t*>(b.ids[k].data()), {static_cast<int64_t>(b.ids[k].size())},
                                  at::kLong).clone());
    t.offsets.push_back(at::from_blob(const_cast<int64_t*>(b.offsets[k].data()),
                                      {static_cast<int64_t>(b.offsets[k].size())}, at::kLong).clone());
  }
  return t;
}

namespace {

data::CtrSchema schema_of(const Config& c) {
  data::CtrSchema schema;
  schema.dense_features = c.dlrm.dense_features;
  schema.table_rows = c.dlrm.table_rows();
  schema.multi_hot = c.dlrm.multi_hot;
  return schema;
}

}  // namespace

data::SyntheticCtrConfig synthetic_config(const Config& c) {
  data::SyntheticCtrConfig s;
  s.schema = schema_of(c);
  s.seed = c.run.seed;
  s.zipf_exponent = c.dlrm.zipf;
  s.signal = c.dlrm.signal;
  s.click_rate = c.dlrm.click_rate;
  return s;
}

std::unique_ptr<data::CtrSource> make_ctr_source(const Config& c) {
  if (c.dlrm.data == "synthetic") return data::make_synthetic_ctr(synthetic_config(c));
  data::CriteoConfig k;
  k.path = c.dlrm.data;
  k.schema = schema_of(c);
  k.val_fraction = c.dlrm.val_fraction;
  k.hash_seed = c.run.seed;
  return data::open_criteo(k);
}

std::vector<recsys::TableDef> plan_tables(const Config& c, int world) {
  const auto rows = c.dlrm.table_rows();
  recsys::ShardingInputs in;
  in.world = world;
  // fp32 weights plus the optimizer's state: one float per row (row-wise Adagrad) or two per element (Adam).
  in.bytes_per_row_element = c.dlrm.sparse_optimizer == "adam" ? 12 : 4;
  in.budget_bytes_per_rank = c.dlrm.memory_budget_mb * (int64_t{1} << 20);
  in.batch_per_rank = c.train.global_batch / world;
  in.requested = c.dlrm.on_parameter_server() ? "row" : c.dlrm.sharding;
  for (int64_t r : rows) {
    recsys::TableShape s;
    s.rows = r;
    s.dim = c.dlrm.embedding_dim;
    s.ids_per_example = static_cast<double>(c.dlrm.multi_hot);
    in.tables.push_back(s);
  }
  // Tables on the parameter server live in files when ps_storage = mmap: the budget is the workers' caches.
  if (c.dlrm.on_parameter_server() && c.dlrm.ps_storage == recsys::TableStorageKind::Mmap) in.budget_bytes_per_rank = 0;
  const auto placements = recsys::plan_sharding(in);
  std::vector<recsys::TableDef> out;
  for (size_t t = 0; t < rows.size(); ++t) out.push_back({rows[t], c.dlrm.embedding_dim, placements[t]});
  if (c.dlrm.on_parameter_server())
    for (auto& t : out) t.placement.reason = "parameter server: row blocks on every rank (" + std::string(recsys::to_string(c.dlrm.ps_storage)) + ")";
  return out;
}

void check_cache_budget(const Config& c) {
  if (!c.dlrm.on_parameter_server() || c.dlrm.memory_budget_mb == 0) return;
  const int64_t budget = c.dlrm.memory_budget_mb << 20;
  const int64_t cache = c.dlrm.cache_rows * c.dlrm.embedding_dim * 4;
  if (cache > budget)
    throw UsageError("dlrm.cache_rows = " + std::to_string(c.dlrm.cache_rows) + " rows of " +
                     std::to_string(c.dlrm.embedding_dim) + " floats take " + std::to_string(cache >> 20) +
                     " MiB, more than dlrm.memory_budget_mb = " + std::to_string(c.dlrm.memory_budget_mb) +
                     ": cache fewer rows or raise the budget");
}

// ---- dense Adam ---------------------------------------------------------------------------------------------

DenseAdam::DenseAdam(std::vector<std::pair<std::string, at::Tensor>> named, const TrainConfig& t)
    : beta1_(t.beta1), beta2_(t.beta2), eps_(t.eps), weight_decay_(t.weight_decay) {
  for (auto& [name, p] : named) {
    names_.push_back(name);
    params_.push_back(p);
    m_.push_back(at::zeros_like(p));
    v_.push_back(at::zeros_like(p));
  }
}

void DenseAdam::zero_grad() {
  for (auto& p : params_)
    if (p.grad().defined()) p.mutable_grad().zero_();
}

void DenseAdam::all_reduce_grads(comm::Communicator& world) {
  if (world.size() == 1) return;
  std::vector<at::Tensor> grads;
  for (auto& p : params_) grads.push_back(p.grad().defined() ? p.grad().reshape({-1}) : at::zeros({p.numel()}));
  at::Tensor flat = at::cat(grads);
  world.all_reduce(flat, comm::ReduceOp::Sum)->wait();
  int64_t at_elem = 0;
  for (auto& p : params_) {
    if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
    p.mutable_grad().copy_(flat.slice(0, at_elem, at_elem + p.numel()).view_as(p));
    at_elem += p.numel();
  }
}

void DenseAdam::step(double lr) {
  ++steps_;
  const double c1 = 1 - std::pow(beta1_, static_cast<double>(steps_));
  const double c2 = 1 - std::pow(beta2_, static_cast<double>(steps_));
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!params_[i].grad().defined()) continue;
    const at::Tensor& g = params_[i].grad();
    m_[i].mul_(beta1_).add_(g, 1 - beta1_);
    v_[i].mul_(beta2_).addcmul_(g, g, 1 - beta2_);
    if (weight_decay_ > 0) params_[i].mul_(1 - lr * weight_decay_);
    params_[i].addcdiv_(m_[i], v_[i].div(c2).sqrt_().add_(eps_), -lr / c1);
  }
}

// ---- parameter server for the dense part --------------------------------------------------------------------

DlrmPsSync::DlrmPsSync(const Config& c, comm::Communicator& world, std::vector<at::Tensor> dense)
    : dense_(std::move(dense)) {
  SyncSetup setup;
  setup.config = c.sync;
  setup.dp = world.size() > 1 ? &world : nullptr;
  setup.dp_index = world.rank();
  setup.dp_size = world.size();
  setup.world_rank = world.rank();
  setup.steps = c.train.steps;
  setup.cluster_hint = cluster_from_environment();
  setup.timeout = comm::Millis(static_cast<int64_t>(c.comm.timeout_s * 1000));
  strategy_ = make_sync_strategy(setup);
}

void DlrmPsSync::start(int64_t first_step) {
  strategy_->attach(dense_, false, {});
  strategy_->start(first_step);
}

// ---- small collectives --------------------------------------------------------------------------------------

double all_reduce_sum(comm::Communicator& world, double value) {
  if (world.size() == 1) return value;
  at::Tensor t = at::full({1}, value, at::kDouble);
  world.all_reduce(t, comm::ReduceOp::Sum)->wait();
  return t.item<double>();
}

at::Tensor all_gather_flat(comm::Communicator& world, const at::Tensor& mine) {
  if (world.size() == 1) return mine;
  at::Tensor all = at::empty({mine.numel() * world.size()}, mine.options());
  world.all_gather(mine.reshape({-1}), all)->wait();
  return all;
}

at::Tensor gather_table(comm::Communicator& world, const recsys::TableDef& table, recsys::EmbeddingBackend& emb,
                        int t) {
  at::Tensor full = at::zeros({table.rows, table.dim}, at::kFloat);
  if (const recsys::EmbeddingShard* s = emb.shard(t))
    full.slice(0, s->first_row(), s->first_row() + s->rows()).slice(1, s->col_begin(), s->col_begin() + s->cols())
        .copy_(s->weight());
  if (world.size() > 1) world.all_reduce(full, comm::ReduceOp::Sum)->wait();
  return full;
}

// ---- output -------------------------------------------------------------------------------------------------

void print_dlrm_header(const Config& c, int world, const std::string& data, const DlrmResult& r) {
  std::printf("crosstrain: DLRM on %d rank%s, %zu tables (%lld rows, dim %lld), %s tables, %s sparse optimizer\n", world,
              world == 1 ? "" : "s", r.placements.size(), static_cast<long long>(r.table_rows_total),
              static_cast<long long>(c.dlrm.embedding_dim), recsys::to_string(c.dlrm.mode), c.dlrm.sparse_optimizer.c_str());
  std::printf("  data: %s\n", data.c_str());
  for (size_t t = 0; t < r.placements.size(); ++t) std::printf("  table %zu: %s\n", t, r.placements[t].c_str());
  std::printf("  rank 0 holds %.1f MiB of tables and optimizer state\n",
              static_cast<double>(r.table_bytes_this_rank) / (1 << 20));
  std::fflush(stdout);
}

void print_dlrm_step(const DlrmStep& s, int64_t steps, bool eval, const DlrmResult& r) {
  std::printf("step %lld/%lld | loss %.4f | %.0f examples/s | embeddings %.1f KiB sent", static_cast<long long>(s.step),
              static_cast<long long>(steps), s.loss, s.examples_per_s, static_cast<double>(s.exchange_bytes) / 1024);
  if (eval) std::printf(" | val auc %.4f log-loss %.4f", r.val_auc, r.val_log_loss);
  if (eval && r.planted_auc >= 0) std::printf(" (the planted signal's auc: %.4f)", r.planted_auc);
  std::printf("\n");
  std::fflush(stdout);
}

void summarize(DlrmResult& r) {
  std::vector<double> rates;
  double bytes = 0;
  for (size_t i = 0; i < r.steps.size(); ++i) {
    if (i > 0 || r.steps.size() == 1) rates.push_back(r.steps[i].examples_per_s);  // the first step warms up
    bytes += static_cast<double>(r.steps[i].exchange_bytes);
  }
  if (!rates.empty()) {
    std::nth_element(rates.begin(), rates.begin() + rates.size() / 2, rates.end());
    r.median_examples_per_s = rates[rates.size() / 2];
  }
  r.mean_exchange_bytes = r.steps.empty() ? 0 : bytes / static_cast<double>(r.steps.size());
  r.anonymous_memory_bytes = obs::anonymous_rss_bytes();
}

void print_dlrm_summary(const DlrmResult& r) {
  std::printf("done: examples_per_s=%.0f exchange_bytes_per_step=%.0f table_rows_total=%lld table_bytes_rank0=%lld "
              "tables_in=%s anonymous_memory_rank0=%lld val_auc=%.4f val_log_loss=%.4f planted_auc=%.4f\n",
              r.median_examples_per_s, r.mean_exchange_bytes, static_cast<long long>(r.table_rows_total),
              static_cast<long long>(r.table_bytes_this_rank), r.tables_in_files ? "files" : "memory",
              static_cast<long long>(r.anonymous_memory_bytes), r.val_auc, r.val_log_loss, r.planted_auc);
  std::fflush(stdout);
}

MetricsFile::MetricsFile(const std::string& path, bool append) {
  if (path.empty()) return;
  out_.open(path, append ? std::ios::app : std::ios::trunc);
}

void MetricsFile::write(const DlrmStep& s, double val_auc, double val_log_loss) {
  if (!out_.is_open()) return;
  nlohmann::json j = {{"step", s.step},
                      {"loss", s.loss},
                      {"step_time_s", s.step_time_s},
                      {"examples_per_s", s.examples_per_s},
                      {"embedding_bytes_sent", s.exchange_bytes}};
  if (val_auc >= 0) j["val_auc"] = val_auc, j["val_log_loss"] = val_log_loss;
  out_ << j.dump() << "\n";
  out_.flush();
}

}  // namespace crosstrain::train

namespace crosstrain::train {

std::unique_ptr<recsys::EmbeddingBackend> make_embeddings(const Config& c, const std::vector<recsys::TableDef>& tables,
                                                          comm::Communicator& world) {
  recsys::SparseOptimizerConfig opt;
  opt.kind = c.dlrm.sparse_optimizer;
  opt.lr = c.dlrm.sparse_lr;
  recsys::TableStorage storage;
  storage.kind = c.dlrm.on_parameter_server() ? c.dlrm.ps_storage : recsys::TableStorageKind::Memory;
  storage.dir = c.run.dir + "/tables";  // the parameter server keeps each rank's files in rank<R>/ below
  if (c.dlrm.on_parameter_server()) return make_ps_embeddings(c, tables, opt, storage, world);
  return std::make_unique<recsys::ShardedEmbeddings>(world, tables, opt, storage, c.run.seed, c.dlrm.pooling == recsys::Pooling::Mean);
}

}  // namespace crosstrain::train
