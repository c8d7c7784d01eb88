#include "crosstrain/train/checkpoint.h"

#include <algorithm>

#include "crosstrain/core/error.h"

namespace crosstrain::train {

namespace {

// A parameter is split over the tensor-parallel group when its shard is smaller than the whole.
bool is_split(const std::vector<int64_t>& global, const at::Tensor& shard, int tp_size) {
  return tp_size > 1 && shard.sizes().vec() != global;
}

const std::vector<int64_t>& global_shape_of(const ModelStateRefs& s, const std::string& name) {
  auto it = s.global_shapes.find(name);
  if (it == s.global_shapes.end()) throw Error("checkpoint: no global shape for parameter '" + name + "'");
  return it->second;
}

checkpoint::Piece piece(const std::string& tensor, const std::string& param, const std::vector<int64_t>& global,
                        const at::Tensor& shard, bool split, const ModelStateRefs& s, int64_t offset, at::Tensor data) {
  checkpoint::Piece p;
  p.tensor = tensor;
  p.param = param;
  p.global_shape = global;
  p.shard_shape = shard.sizes().vec();
  p.tp_rank = split ? s.tp_rank : 0;
  p.tp_size = split ? s.tp_size : 1;
  p.offset = offset;
  p.data = data.detach().reshape(-1).clone();  // a snapshot: training may change the original right away
  return p;
}

std::string key_of(const at::Tensor& t) { return c10::guts::to_string(t.unsafeGetTensorImpl()); }

// While rank 0 renames or removes a checkpoint directory the others wait on it: slow storage can take longer
// than a collective should, so these waits get at least ten minutes.
comm::Millis storage_wait(double timeout_s) {
  return comm::Millis(static_cast<int64_t>(std::max(600.0, timeout_s) * 1000));
}

}  // namespace

nlohmann::json state_to_info(const CheckpointState& s) {
  return {{"step", s.step},
          {"sampler", {{"seed", s.sampler.seed}, {"next_step", s.sampler.next_step}}},
          {"layout", {{"dp", s.dp}, {"pp", s.pp}, {"tp", s.tp}, {"zero", s.zero}}},
          {"rng", "dropout masks are drawn from run.seed, the rank and the step, so a resumed run needs no saved state"},
          {"config", s.config_toml}};
}

CheckpointState state_from_info(const checkpoint::CheckpointReader& reader) {
  try {
    const auto& info = reader.info();
    CheckpointState s;
    s.step = info.at("step").get<int64_t>();
    s.sampler.seed = info.at("sampler").at("seed").get<uint64_t>();
    s.sampler.next_step = info.at("sampler").at("next_step").get<int64_t>();
    const auto& layout = info.at("layout");
    s.dp = layout.at("dp").get<int>();
    s.pp = layout.at("pp").get<int>();
    s.tp = layout.at("tp").get<int>();
    s.zero = layout.value("zero", 0);
    s.config_toml = info.value("config", "");
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw UsageError("checkpoint manifest '" + reader.dir() + "/manifest.json' lacks the training state: " + e.what());
  }
}

std::vector<checkpoint::Piece> snapshot_pieces(const ModelStateRefs& s, int64_t* optimizer_step) {
  torch::NoGradGuard no_grad;
  std::vector<checkpoint::Piece> pieces;
  *optimizer_step = 0;
  if (s.zero) {
    *optimizer_step = s.zero->step_count();
    std::map<const c10::TensorImpl*, std::string> names;
    for (const auto& [name, t] : *s.parameters) names[t.unsafeGetTensorImpl()] = name;
    for (auto& slice : s.zero->owned_slices()) {
      const std::string& name = names.at(slice.tensor.unsafeGetTensorImpl());
      const auto& global = global_shape_of(s, name);
      const bool split = is_split(global, slice.tensor, s.tp_size);
      if (!split && s.tp_rank != 0) continue;  // replicated: tensor-parallel rank 0 writes it
      pieces.push_back(piece(name, name, global, slice.tensor, split, s, slice.param_offset, slice.value));
      pieces.push_back(piece(name + "#exp_avg", name, global, slice.tensor, split, s, slice.param_offset, slice.exp_avg));
      pieces.push_back(piece(name + "#exp_avg_sq", name, global, slice.tensor, split, s, slice.param_offset, slice.exp_avg_sq));
    }
    return pieces;
  }
  auto& state = s.adamw->state();
  for (const auto& [name, t] : *s.parameters) {
    const auto& global = global_shape_of(s, name);
    const bool split = is_split(global, t, s.tp_size);
    if (!split && s.tp_rank != 0) continue;
    // Each data-parallel rank writes an even share of the (identical) replicas.
    const int64_t n = t.numel(), begin = s.dp_rank * n / s.dp_size, end = (s.dp_rank + 1) * n / s.dp_size;
    if (begin == end) continue;
    at::Tensor flat = t.detach().reshape(-1);
    at::Tensor m, v;
    auto it = state.find(key_of(t));
    if (it != state.end()) {
      auto& st = static_cast<torch::optim::AdamWParamState&>(*it->second);
      m = st.exp_avg().reshape(-1);
      v = st.exp_avg_sq().reshape(-1);
      *optimizer_step = st.step();
    } else {
      m = v = at::zeros({n}, flat.options());
    }
    pieces.push_back(piece(name, name, global, t, split, s, begin, flat.narrow(0, begin, end - begin)));
    pieces.push_back(piece(name + "#exp_avg", name, global, t, split, s, begin, m.narrow(0, begin, end - begin)));
    pieces.push_back(piece(name + "#exp_avg_sq", name, global, t, split, s, begin, v.narrow(0, begin, end - begin)));
  }
  return pieces;
}

void load_model_state(checkpoint::CheckpointReader& reader, const ModelStateRefs& s, int64_t optimizer_step) {
  const std::string manifest = reader.dir() + "/manifest.json";
  // Everything is checked before anything is changed.
  for (const auto& [name, t] : *s.parameters) {
    for (const std::string& tensor : {name, name + "#exp_avg", name + "#exp_avg_sq"})
      if (!reader.has(tensor))
        throw UsageError("checkpoint '" + reader.dir() + "' has no tensor '" + tensor + "' (" + manifest +
                         "): it was written for another model");
    const auto& global = global_shape_of(s, name);
    if (reader.global_shape(name) != global)
      throw UsageError("checkpoint '" + reader.dir() + "': parameter '" + name + "' has shape " +
                       c10::str(c10::IntArrayRef(reader.global_shape(name))) + " in " + manifest + " but this model's is " +
                       c10::str(c10::IntArrayRef(global)) + ": it was written for another model configuration");
  }
  std::map<std::string, std::vector<parallel::ZeroOptimizer::OwnedSlice>> slices;
  if (s.zero) {
    std::map<const c10::TensorImpl*, std::string> names;
    for (const auto& [name, t] : *s.parameters) names[t.unsafeGetTensorImpl()] = name;
    for (auto& slice : s.zero->owned_slices()) slices[names.at(slice.tensor.unsafeGetTensorImpl())].push_back(slice);
  }
  // Read every tensor first (this validates pieces and checksums), then copy.
  struct Loaded {
    at::Tensor value, exp_avg, exp_avg_sq;
  };
  std::map<std::string, Loaded> loaded;
  for (const auto& [name, t] : *s.parameters) {
    auto shard = [&](const std::string& tensor) {
      return s.split(name, reader.read_full(tensor, s.split), s.tp_rank, s.tp_size).contiguous();
    };
    Loaded l{shard(name), shard(name + "#exp_avg"), shard(name + "#exp_avg_sq")};
    if (l.value.sizes() != t.sizes())
      throw UsageError("checkpoint '" + reader.dir() + "': parameter '" + name + "' splits into " +
                       c10::str(l.value.sizes()) + " but this rank holds " + c10::str(t.sizes()));
    loaded[name] = l;
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : *s.parameters) {
    const Loaded& l = loaded[name];
    if (s.zero) {
      // Stages 1-2 hold whole parameters; stage 3 only its slices (the parameter memory is released).
      if (s.zero->stage() < 3) const_cast<torch::Tensor&>(t).copy_(l.value);
      for (auto& slice : slices[name]) {
        const int64_t n = slice.value.numel();
        slice.value.copy_(l.value.reshape(-1).narrow(0, slice.param_offset, n));
        slice.exp_avg.copy_(l.exp_avg.reshape(-1).narrow(0, slice.param_offset, n));
        slice.exp_avg_sq.copy_(l.exp_avg_sq.reshape(-1).narrow(0, slice.param_offset, n));
      }
    } else {
      const_cast<torch::Tensor&>(t).copy_(l.value);
      auto st = std::make_unique<torch::optim::AdamWParamState>();
      st->step(optimizer_step);
      st->exp_avg(l.exp_avg.view(t.sizes()).clone());
      st->exp_avg_sq(l.exp_avg_sq.view(t.sizes()).clone());
      s.adamw->state()[key_of(t)] = std::move(st);
    }
  }
  if (s.zero) {
    s.zero->set_step_count(optimizer_step);
    s.zero->master_weights_changed();
  }
}

namespace {

// Every rank's records, on every rank: lengths first, then the padded bytes.
std::vector<checkpoint::PieceRecord> gather_records(comm::Communicator& world,
                                                    const std::vector<checkpoint::PieceRecord>& mine) {
  const std::string text = checkpoint::records_to_json(mine).dump();
  at::Tensor length = at::full({1}, static_cast<int64_t>(text.size()), at::kLong);
  at::Tensor lengths = at::empty({world.size()}, at::kLong);
  world.all_gather(length, lengths)->wait();
  const int64_t longest = lengths.max().item<int64_t>();
  at::Tensor bytes = at::zeros({longest}, at::kByte);
  std::copy(text.begin(), text.end(), bytes.data_ptr<uint8_t>());
  at::Tensor all = at::empty({longest * world.size()}, at::kByte);
  world.all_gather(bytes, all)->wait();
  std::vector<checkpoint::PieceRecord> records;
  for (int r = 0; r < world.size(); ++r) {
    const char* begin = reinterpret_cast<const char*>(all.data_ptr<uint8_t>()) + r * longest;
    auto part = checkpoint::records_from_json(nlohmann::json::parse(begin, begin + lengths[r].item<int64_t>()));
    records.insert(records.end(), part.begin(), part.end());
  }
  return records;
}

}  // namespace

CheckpointWriter::CheckpointWriter(comm::Communicator& world, std::string run_dir, int keep_last, bool async,
                                   double timeout_s)
    : world_(world), run_dir_(std::move(run_dir)), keep_last_(keep_last), async_(async), timeout_s_(timeout_s) {}

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();
}

void CheckpointWriter::save(int64_t step, std::vector<checkpoint::Piece> pieces, nlohmann::json info) {
  commit();
  pending_ = true;
  step_ = step;
  info_ = std::move(info);
  error_ = nullptr;
  records_.clear();
  const std::string tmp = checkpoint::temp_checkpoint_dir(run_dir_, step);
  auto work = [this, tmp, pieces = std::move(pieces), rank = world_.rank()] {
    try {
      records_ = checkpoint::write_pieces(tmp, rank, pieces);
    } catch (...) {
      error_ = std::current_exception();
    }
  };
  if (async_)
    thread_ = std::thread(std::move(work));
  else
    work();
}

std::string CheckpointWriter::commit() {
  if (!pending_) return "";
  if (thread_.joinable()) thread_.join();
  pending_ = false;
  // A failed write on any rank fails the save everywhere (the flag rides on the records exchange).
  int failed = error_ ? 1 : 0;
  at::Tensor flag = at::full({1}, failed, at::kInt);
  world_.all_reduce(flag, comm::ReduceOp::Max)->wait();
  const std::string step = "checkpoint of step " + std::to_string(step_);
  const std::string kept = "; its partial files were removed and any earlier checkpoint is kept";
  if (flag.item<int>() != 0) {
    // Every rank's writer has finished (the exchange above waits for them): the partial directory goes, so
    // a full disk is not left fuller.
    if (world_.rank() == 0) checkpoint::discard_checkpoint_attempt(run_dir_, step_);
    // Nobody fails (and has the launcher stop the others) before the directory is gone.
    world_.barrier()->wait(storage_wait(timeout_s_));
    if (error_) {
      try {
        std::rethrow_exception(error_);
      } catch (const std::exception& e) {
        throw Error(step + " failed: " + e.what() + kept);
      }
    }
    throw Error(step + " failed on another rank" + kept);
  }
  auto records = gather_records(world_, records_);
  std::string dir, failure;
  if (world_.rank() == 0) {
    try {
      dir = checkpoint::commit_checkpoint(run_dir_, step_, records, info_, keep_last_);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  // Rank 0 tells everyone whether the commit held; nobody runs ahead of a checkpoint being committed.
  at::Tensor committed = at::full({1}, failure.empty() ? 0 : 1, at::kInt);
  world_.all_reduce(committed, comm::ReduceOp::Max)->wait(storage_wait(timeout_s_));
  if (!failure.empty()) throw Error(step + " failed: " + failure + "; any earlier checkpoint is kept");
  if (committed.item<int>() != 0) throw Error(step + " failed on rank 0" + kept);
  return world_.rank() == 0 ? dir : checkpoint::final_checkpoint_dir(run_dir_, step_);
}

}  // namespace crosstrain::train
