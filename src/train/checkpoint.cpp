#include "crosstrain/train/checkpoint.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>

#include "crosstrain/core/error.h"
#include "crosstrain/core/fence.h"
#include "crosstrain/train/checkpoint_sites.h"
#include "crosstrain/train/site_stager.h"

namespace crosstrain::train {

namespace {

// While rank 0 renames or removes a checkpoint directory the others wait on it: slow storage can take longer
// than a collective should, so these waits get at least ten minutes.
comm::Millis storage_wait(double timeout_s) {
  return comm::Millis(static_cast<int64_t>(std::max(600.0, timeout_s) * 1000));
}

// The staging description, synced: the stager of the next placement may find it after a power cut.
void write_json_synced(const std::filesystem::path& path, const nlohmann::json& j) {
  {
    std::ofstream out(path);
    out << j.dump() << "\n";
    if (!out.flush()) throw Error("cannot write " + path.string());
  }
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0 || ::fsync(fd) != 0) {
    if (fd >= 0) ::close(fd);
    throw Error("cannot sync " + path.string());
  }
  ::close(fd);
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
  stager_.reset();  // stops its thread before the communicator it was carved from may go
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
  if (sites.sites() > 1) ensure_stager(sites);
  // Without a shared file system every rank's file goes to the other sites, checked against its checksum.
  const std::vector<StagedFile> files = sites.sites() > 1 ? gather_file_sums() : std::vector<StagedFile>{};
  agree_written(sites);
  auto records = gather_records(world_, records_);
  return sites.sites() > 1 ? hand_to_stager(sites, records, files) : commit_here(records);
}

// A failed write on any rank fails the save everywhere; the partial directory goes, so a full disk is not left
// fuller. Collective: every rank takes part, also one whose own write failed.
void CheckpointWriter::agree_written(const SiteMap& sites) {
  at::Tensor flag = at::full({1}, error_ ? 1 : 0, at::kInt);
  world_.all_reduce(flag, comm::ReduceOp::Max)->wait();
  if (flag.item<int>() == 0) return;
  const std::string step = "checkpoint of step " + std::to_string(step_);
  const std::string kept = "; its partial files were removed and any earlier checkpoint is kept";
  // Every rank's writer has finished (the exchange above waits for them): each site's first rank removes it there.
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

std::string CheckpointWriter::commit_here(const std::vector<checkpoint::PieceRecord>& records) {
  const std::string step = "checkpoint of step " + std::to_string(step_);
  std::string dir, failure;
  if (world_.rank() == 0) {
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
  if (committed.item<int>() != 0)
    throw Error(step + " failed on rank 0; its partial files were removed and any earlier checkpoint is kept");
  return world_.rank() == 0 ? dir : checkpoint::final_checkpoint_dir(run_dir_, step_);
}

// Every rank's piece file of the save, on every rank: its size (0: none) and checksum.
std::vector<StagedFile> CheckpointWriter::gather_file_sums() {
  const std::string own =
      (std::filesystem::path(checkpoint::temp_checkpoint_dir(run_dir_, step_)) / checkpoint::piece_file_name(world_.rank()))
          .string();
  int64_t size = 0;
  uint64_t sum = 0;
  if (!error_ && std::filesystem::exists(own)) {
    const std::string hex = file_checksum(own, &size);
    if (hex.empty()) error_ = std::make_exception_ptr(Error("cannot read " + own + " to send it to the other sites"));
    else sum = std::stoull(hex, nullptr, 16);
  }
  at::Tensor all = at::empty({2 * world_.size()}, at::kLong);
  world_.all_gather(at::tensor({size, static_cast<int64_t>(sum)}, at::kLong), all)->wait();
  std::vector<StagedFile> files;
  for (int r = 0; r < world_.size(); ++r) {
    const int64_t* v = all.data_ptr<int64_t>() + 2 * r;
    files.push_back(StagedFile{v[0], Fnv1a::hex(static_cast<uint64_t>(v[1]))});
  }
  return files;
}

// Collective. Each site's leader describes the checkpoint (staging.json) beside its site's files and hands it to
// its stager; training goes on while the files cross. Returns the directory the checkpoint will have.
std::string CheckpointWriter::hand_to_stager(const SiteMap& sites, const std::vector<checkpoint::PieceRecord>& records,
                                             const std::vector<StagedFile>& files) {
  namespace fs = std::filesystem;
  std::string failure;
  if (sites.leads(world_.rank())) {
    try {
      const fs::path tmp = checkpoint::temp_checkpoint_dir(run_dir_, step_);
      nlohmann::json listed = nlohmann::json::object();
      std::set<std::string> ours;  // this site's ranks' files: the rest arrive
      for (int r = 0; r < world_.size(); ++r) {
        if (files[r].size <= 0) continue;
        listed[checkpoint::piece_file_name(r)] = {files[r].size, files[r].checksum};
        if (sites.site_of[r] == sites.site_of[world_.rank()]) ours.insert(checkpoint::piece_file_name(r));
      }
      fs::create_directories(tmp);
      for (const auto& entry : fs::directory_iterator(tmp))  // an earlier attempt's files are not this save's
        if (!ours.count(entry.path().filename().string())) fs::remove_all(entry.path());
      nlohmann::json info = info_;
      info["site_files"] = listed;  // the stagers find every site's copy by these, and whose it is by the fence
      info["site_origin"] = fence_;
      write_json_synced(tmp / kStagingFile, {{"step", step_}, {"records", checkpoint::records_to_json(records)},
                                             {"info", info}, {"files", listed}, {"origin", fence_}});
      stager_->adopt(step_);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  at::Tensor flag = at::full({1}, failure.empty() ? 0 : 1, at::kInt);
  world_.all_reduce(flag, comm::ReduceOp::Max)->wait(storage_wait(timeout_s_));
  const std::string step = "checkpoint of step " + std::to_string(step_);
  if (!failure.empty()) throw Error(step + " could not be handed to the stager: " + failure);
  if (flag.item<int>() != 0) throw Error(step + " could not be handed to another site's stager");
  return checkpoint::final_checkpoint_dir(run_dir_, step_);
}

// Collective, the first time the ranks find themselves at several sites: the leaders' group and this site's
// stager, which first resumes what an earlier placement left half staged.
void CheckpointWriter::ensure_stager(const SiteMap& sites) {
  if (stager_checked_) return;
  std::unique_ptr<comm::Communicator> leaders = world_.split(sites.leaders);
  stager_checked_ = true;
  if (!leaders) return;
  StagerOptions options;
  options.run_dir = run_dir_;
  options.keep_last = keep_last_;
  options.fence = fence_;
  options.faults = faults_;
  if (stage_chunk_bytes_ > 0) options.chunk_bytes = stage_chunk_bytes_;
  stager_ = std::make_unique<SiteStager>(std::move(leaders), std::move(options));
  stager_->resume();
}

void CheckpointWriter::drain() {
  if (!stager_checked_) return;  // every rank alike: set by the same collective commit
  if (stager_) stager_->drain();
  // The leaders may move the last checkpoint over slow links for minutes; a collective waits only the group's
  // timeout, so all ranks ask each other every second (short all-reduces) until no stager is busy, for up to an hour.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::hours(1);
  std::string failure;
  for (;;) {
    std::optional<std::string> state = stager_ ? stager_->drained(std::chrono::seconds(1)) : std::optional<std::string>("");
    if (state && !state->empty()) failure = *state;
    const bool late = std::chrono::steady_clock::now() > deadline;
    at::Tensor flags = at::tensor({state ? 0 : 1, failure.empty() ? 0 : 1, late ? 1 : 0}, at::kInt);
    world_.all_reduce(flags, comm::ReduceOp::Max)->wait();
    const auto* f = flags.data_ptr<int>();
    if (f[1] != 0 || (f[0] != 0 && f[2] != 0))
      throw Error("the checkpoints did not reach every site (" +
                  (!failure.empty() ? failure
                   : f[1] != 0      ? std::string("staging stopped at another site")
                                    : std::string("still moving after an hour")) +
                  "); each site keeps the newest checkpoint that reached it whole, and the job's next placement "
                  "resumes the files cut off");
    if (f[0] == 0) return;
  }
}

StagingStats CheckpointWriter::staging_stats() const { return stager_ ? stager_->stats() : StagingStats{}; }

}  // namespace crosstrain::train
