#include "crosstrain/recsys/ps_embedding.h"

#include <ATen/ATen.h>

namespace crosstrain::recsys {
namespace {

std::vector<TableShape> shapes_of(const std::vector<TableDef>& tables) {
  std::vector<TableShape> out;
  for (const auto& t : tables) {
    TableShape s;
    s.rows = t.rows;
    s.dim = t.dim;
    out.push_back(s);
  }
  return out;
}

}  // namespace

PsEmbeddings::PsEmbeddings(std::unique_ptr<comm::Communicator> group, const std::vector<TableDef>& tables,
                           const SparseOptimizerConfig& opt, const TableStorage& storage, uint64_t seed,
                           comm::Millis timeout, int64_t cache_rows, int64_t max_age, bool mean_pooling)
    : group_(std::move(group)), mean_pooling_(mean_pooling) {
  server_ = std::make_unique<SparseParameterServer>(*group_, shapes_of(tables), opt, storage, seed, timeout);
  client_ = std::make_unique<CachedSparseClient>(*server_, cache_rows, max_age);
}

PsEmbeddings::~PsEmbeddings() {
  try {
    finish();
  } catch (...) {  // a destructor must not throw; the run already reported its failure
  }
}

std::vector<at::Tensor> PsEmbeddings::forward(const std::vector<at::Tensor>& ids, const std::vector<at::Tensor>& offsets,
                                              bool training) {
  std::vector<at::Tensor> unique, inverse;
  for (const auto& t : ids) {
    UniqueIds d = dedup(t);
    unique.push_back(d.unique);
    inverse.push_back(d.inverse);
  }
  std::vector<at::Tensor> rows = client_->rows_for(unique, step_);
  std::vector<at::Tensor> pooled;
  for (size_t t = 0; t < ids.size(); ++t) {
    if (training) rows[t] = rows[t].detach().requires_grad_(true);
    pooled.push_back(pool_bags(rows[t], inverse[t], offsets[t], mean_pooling_));
  }
  if (training) unique_ = std::move(unique), leaves_ = std::move(rows);
  return pooled;
}

void PsEmbeddings::update(int64_t step) {
  std::vector<at::Tensor> grads;
  for (const auto& leaf : leaves_) grads.push_back(leaf.grad().defined() ? leaf.grad() : at::zeros_like(leaf));
  client_->push(unique_, grads, step);
  unique_.clear();
  leaves_.clear();
}

void PsEmbeddings::finish() {
  if (finished_) return;
  finished_ = true;
  server_->finish();
}

}  // namespace crosstrain::recsys
