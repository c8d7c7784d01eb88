#include "crosstrain/train/checkpoint.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "crosstrain/core/error.h"
#include "crosstrain/core/fence.h"
#include "crosstrain/train/checkpoint_sites.h"

namespace crosstrain::train {

namespace {

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
                                   double timeout_s, checkpoint::StorageFaults faults, std::string fence,
                                   std::string site)
    : world_(world), run_dir_(std::move(run_dir)), keep_last_(keep_last), async_(async), timeout_s_(timeout_s),
      faults_(faults), fence_(std::move(fence)), site_(std::move(site)) {}

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
      records_ = checkpoint::write_pieces(tmp, rank, pieces, faults_);
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
  // Which ranks share storage: each site's first rank commits there.
  const SiteMap sites = map_sites(world_, site_);
  // Without a shared file system, every rank's piece file also goes to every other site (checksummed).
  // Collective: every rank takes part, also one whose own write failed (the flag below fails the save then).
  const std::string staging =
      sites.sites() > 1 ? stage_piece_files(world_, sites, checkpoint::temp_checkpoint_dir(run_dir_, step_)) : "";
  if (!staging.empty() && !error_)
    error_ = std::make_exception_ptr(Error("staging the checkpoint between sites: " + staging));
  // A failed write on any rank fails the save everywhere (the flag rides on the records exchange).
  int failed = error_ ? 1 : 0;
  at::Tensor flag = at::full({1}, failed, at::kInt);
  world_.all_reduce(flag, comm::ReduceOp::Max)->wait();
  const std::string step = "checkpoint of step " + std::to_string(step_);
  const std::string kept = "; its partial files were removed and any earlier checkpoint is kept";
  if (flag.item<int>() != 0) {
    // Every rank's writer has finished (the exchange above waits for them): the partial directory goes, so
    // a full disk is not left fuller.
    if (sites.leads(world_.rank())) checkpoint::discard_checkpoint_attempt(run_dir_, step_, faults_);
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
  if (sites.leads(world_.rank())) {
    // Fenced off (a newer placement owns the run folder): nothing of this one may become the job's state.
    failure = fence_refusal(run_dir_, fence_);
    if (!failure.empty()) {
      checkpoint::discard_checkpoint_attempt(run_dir_, step_, faults_);
    } else {
      try {
        dir = checkpoint::commit_checkpoint(run_dir_, step_, records, info_, keep_last_, faults_);
      } catch (const std::exception& e) {
        failure = e.what();
      }
    }
  }
  // Rank 0 tells everyone whether the commit held; nobody runs ahead of a checkpoint being committed.
  at::Tensor committed = at::full({1}, failure.empty() ? 0 : 1, at::kInt);
  world_.all_reduce(committed, comm::ReduceOp::Max)->wait(storage_wait(timeout_s_));
  if (!failure.empty()) throw Error(step + " failed: " + failure + "; any earlier checkpoint is kept");
  if (committed.item<int>() != 0) throw Error(step + " failed on rank 0" + kept);
  return sites.leads(world_.rank()) ? dir : checkpoint::final_checkpoint_dir(run_dir_, step_);
}

}  // namespace crosstrain::train
