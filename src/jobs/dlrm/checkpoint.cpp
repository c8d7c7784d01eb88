// DLRM checkpoints in the distributed format (checkpoint/distributed.h): a row block is a contiguous range of
// the flattened table, a column block a tensor-parallel shard split along dim 1, so a checkpoint saved by any
// number of ranks with any sharding reloads into any other.
#include <ATen/ATen.h>

#include "crosstrain/core/error.h"
#include "crosstrain/train/checkpoint.h"
#include "parts.h"

namespace crosstrain::train {
namespace {

checkpoint::Piece whole(const std::string& name, const at::Tensor& t) {
  checkpoint::Piece p;
  p.tensor = p.param = name;
  p.global_shape = p.shard_shape = t.sizes().vec();
  p.data = t.detach().reshape({-1}).clone();
  return p;
}

// Table t's tensor `name` ([rows, cols] block, or the per-row [rows] Adagrad state) as a piece of the whole.
checkpoint::Piece table_piece(const std::string& name, const recsys::TableDef& table, const recsys::EmbeddingShard& s,
                              const at::Tensor& t, int rank, int world) {
  checkpoint::Piece p;
  p.tensor = name;
  p.param = name;
  const bool per_row = t.dim() == 1;
  p.global_shape = per_row ? std::vector<int64_t>{table.rows} : std::vector<int64_t>{table.rows, table.dim};
  p.shard_shape = p.global_shape;
  if (table.placement.sharding == recsys::Sharding::Column && !per_row) {
    p.tp_rank = rank;
    p.tp_size = world;
    p.shard_shape = {table.rows, s.cols()};
  }
  p.offset = s.first_row() * (per_row ? 1 : s.cols());
  p.data = t.reshape({-1}).clone();
  return p;
}

}  // namespace

std::string table_tensor_name(int t) { return "embeddings.t" + std::to_string(t) + ".weight"; }

checkpoint::SplitFn dlrm_split() {
  return [](const std::string&, const at::Tensor& full, int rank, int size) { return recsys::column_block(full, rank, size); };
}

checkpoint::SplitFn dlrm_checkpoint_split() { return dlrm_split(); }

std::vector<checkpoint::Piece> checkpoint_pieces(const std::vector<recsys::TableDef>& tables,
                                                 recsys::EmbeddingBackend& emb, DenseAdam& adam, int rank, int world) {
  std::vector<checkpoint::Piece> pieces;
  for (size_t t = 0; t < tables.size(); ++t) {
    const recsys::EmbeddingShard* s = emb.shard(static_cast<int>(t));
    if (!s) continue;
    const std::string name = table_tensor_name(static_cast<int>(t));
    pieces.push_back(table_piece(name, tables[t], *s, s->weight(), rank, world));
    for (const auto& [suffix, state] : s->state()) {
      // Every column block holds the same per-row Adagrad sums (summed over the columns): rank 0 saves them.
      if (state.dim() == 1 && tables[t].placement.sharding == recsys::Sharding::Column && rank != 0) continue;
      pieces.push_back(table_piece(name + "#" + suffix, tables[t], *s, state, rank, world));
    }
  }
  if (rank == 0) {
    for (size_t i = 0; i < adam.parameters().size(); ++i) {
      const std::string name = "dense." + adam.names()[i];
      pieces.push_back(whole(name, adam.parameters()[i]));
      pieces.push_back(whole(name + "#exp_avg", adam.exp_avg()[i]));
      pieces.push_back(whole(name + "#exp_avg_sq", adam.exp_avg_sq()[i]));
    }
  }
  return pieces;
}

nlohmann::json checkpoint_info(const Config& c, int64_t step, int world, const std::vector<recsys::TableDef>& tables) {
  nlohmann::json sharding = nlohmann::json::array();
  for (const auto& t : tables) sharding.push_back(recsys::sharding_name(t.placement.sharding));
  return {{"step", step},
          {"optimizer_step", step},
          {"model", models::to_string(models::ModelArch::Dlrm)},
          {"layout", {{"dp", world}, {"pp", 1}, {"tp", 1}, {"zero", 0}, {"tables", sharding}}},
          {"sampler", {{"seed", c.run.seed}, {"next_step", step + 1}}},
          {"rng", "examples are a function of their index and run.seed: a resumed run needs no saved data state"},
          {"config", to_toml(c)}};
}

namespace {

// `full` (the whole tensor) cut to what shard `s` holds.
at::Tensor cut_to_shard(const at::Tensor& full, const recsys::EmbeddingShard& s) {
  at::Tensor rows = full.slice(0, s.first_row(), s.first_row() + s.rows());
  return full.dim() == 1 ? rows : rows.slice(1, s.col_begin(), s.col_begin() + s.cols());
}

at::Tensor read_checked(checkpoint::CheckpointReader& reader, const std::string& name, std::vector<int64_t> shape) {
  if (!reader.has(name))
    throw UsageError("checkpoint '" + reader.dir() + "' has no tensor '" + name +
                     "': it was saved by another model or sparse optimizer (dlrm.sparse_optimizer)");
  if (reader.global_shape(name) != shape)
    throw UsageError("checkpoint '" + reader.dir() + "': tensor '" + name + "' is " +
                     c10::str(c10::IntArrayRef(reader.global_shape(name))) + ", this run's is " +
                     c10::str(c10::IntArrayRef(shape)) + " (dlrm.tables / dlrm.embedding_dim differ)");
  return reader.read_full(name, dlrm_split());
}

}  // namespace

void load_checkpoint(checkpoint::CheckpointReader& reader, const std::vector<recsys::TableDef>& tables,
                     recsys::EmbeddingBackend& emb, DenseAdam& adam, int rank, int world) {
  if (reader.info().value("model", "") != models::to_string(models::ModelArch::Dlrm))
    throw UsageError("checkpoint '" + reader.dir() + "' is not a DLRM checkpoint (model.arch differs)");
  at::NoGradGuard no_grad;
  for (size_t t = 0; t < tables.size(); ++t) {
    recsys::EmbeddingShard* s = emb.shard(static_cast<int>(t));
    if (!s) continue;
    const std::string name = table_tensor_name(static_cast<int>(t));
    s->weight().copy_(cut_to_shard(read_checked(reader, name, {tables[t].rows, tables[t].dim}), *s));
    for (auto& [suffix, state] : s->state()) {
      const auto shape = state.dim() == 1 ? std::vector<int64_t>{tables[t].rows}
                                          : std::vector<int64_t>{tables[t].rows, tables[t].dim};
      state.copy_(cut_to_shard(read_checked(reader, name + "#" + suffix, shape), *s));
    }
  }
  for (size_t i = 0; i < adam.parameters().size(); ++i) {
    const std::string name = "dense." + adam.names()[i];
    const auto shape = adam.parameters()[i].sizes().vec();
    adam.parameters()[i].detach().copy_(read_checked(reader, name, shape));
    adam.exp_avg()[i].copy_(read_checked(reader, name + "#exp_avg", shape));
    adam.exp_avg_sq()[i].copy_(read_checked(reader, name + "#exp_avg_sq", shape));
  }
  adam.steps() = reader.info().value("optimizer_step", reader.step());
}

}  // namespace crosstrain::train
