#include "crosstrain/checkpoint/distributed.h"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <set>
#include <sstream>
#include <thread>

#include "crosstrain/checkpoint/safetensors.h"
#include "crosstrain/core/error.h"
#include "crosstrain/core/names.h"

namespace crosstrain::checkpoint {
namespace fs = std::filesystem;

namespace {

constexpr int kFormatVersion = 3;
constexpr const char* kManifest = "manifest.json";

void fsync_path(const fs::path& p) {
  int fd = open(p.c_str(), O_RDONLY);
  if (fd >= 0) {
    fsync(fd);
    close(fd);
  }
}

// Writes and syncs a whole file; a failure (ENOSPC may only show at fsync or close) names the errno.
void write_synced(const fs::path& path, const std::string& text) {
  auto fail = [&](const char* what) {
    return Error("cannot " + std::string(what) + " the checkpoint manifest '" + path.string() + "': " +
                 std::strerror(errno));
  };
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw fail("create");
  for (size_t done = 0; done < text.size();) {
    ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int saved = errno;
      close(fd);
      errno = n == 0 ? EIO : saved;
      throw fail("write");
    }
    done += static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    const int saved = errno;
    close(fd);
    errno = saved;
    throw fail("sync");
  }
  if (close(fd) != 0) throw fail("close");
}

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "F32";
    case at::kBFloat16: return "BF16";
    case at::kHalf: return "F16";
    case at::kDouble: return "F64";
    default: return c10::toString(t);
  }
}

// The most elements one tensor of a manifest may have (2^40: 4 TB of fp32): a shape beyond it, or a negative
// dimension, is a damaged or hostile manifest, refused before anything is allocated for it.
constexpr int64_t kMaxManifestNumel = int64_t{1} << 40;

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (auto d : shape) {
    if (d < 0 || (d > 0 && n > kMaxManifestNumel / d)) return -1;
    n *= d;
  }
  return n;
}

// Every piece of a tensor before anything is read: its file lies in the checkpoint's directory, its shapes and
// tensor-parallel place are sane and agree with the tensor's other pieces, and the pieces of each shard tile it
// exactly (no gap, no overlap). Sizes are then bounded by the files' own headers (read_full checks each piece's
// element count against its file before allocating).
void check_pieces(const std::string& tensor, std::vector<PieceRecord>& pieces, const std::string& manifest) {
  auto bad = [&](const std::string& why) {
    throw UsageError("checkpoint manifest '" + manifest + "': tensor '" + tensor.substr(0, 200) + "': " + why);
  };
  const PieceRecord& first = pieces.front();
  const int64_t global = numel_of(first.global_shape), shard = numel_of(first.shard_shape);
  if (global < 0 || shard < 0) bad("a shape with a negative dimension or more than 2^40 elements");
  if (first.tp_size < 1 || first.tp_size > 65536) bad("tp_size " + std::to_string(first.tp_size) + " is out of range");
  if (shard * first.tp_size != global)
    bad(std::to_string(first.tp_size) + " shards of " + std::to_string(shard) + " elements do not make " +
        std::to_string(global));
  for (const auto& p : pieces) {
    if (const std::string why = file_name_error(p.file); !why.empty()) bad("piece file " + why);
    if (p.tp_size != first.tp_size || p.global_shape != first.global_shape || p.shard_shape != first.shard_shape ||
        p.dtype != first.dtype || p.param != first.param)
      bad("its pieces disagree on its shape, dtype or tensor-parallel split");
    if (p.tp_rank < 0 || p.tp_rank >= p.tp_size || p.offset < 0 || p.numel < 0 || p.offset > shard - p.numel)
      bad("a piece lies outside its shard");
  }
  std::sort(pieces.begin(), pieces.end(), [](const PieceRecord& a, const PieceRecord& b) {
    return a.tp_rank != b.tp_rank ? a.tp_rank < b.tp_rank : a.offset < b.offset;
  });
  std::vector<int64_t> next(first.tp_size, 0);  // where each shard's next piece must start
  for (const auto& p : pieces) {
    if (p.offset != next[p.tp_rank]) bad(p.offset < next[p.tp_rank] ? "two pieces overlap" : "a shard has a gap");
    next[p.tp_rank] += p.numel;
  }
  for (int64_t covered : next)
    if (covered != shard) bad("a tensor-parallel shard is not covered by its pieces");
}

// A slow disk (debug.fault_save_delay_ms), for the tests that stop a job while a save is under way.
void slow_storage_fault(const StorageFaults& faults) {
  if (faults.save_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(faults.save_delay_ms));
}

// debug.fault_commit_rename: the final rename fails, as on a full or read-only file system, which no test can
// cause for root.
void rename_into_place(const fs::path& tmp, const fs::path& final_dir, const StorageFaults& faults) {
  if (faults.commit_rename)
    throw fs::filesystem_error("cannot rename", tmp, final_dir, std::make_error_code(std::errc::io_error));
  fs::rename(tmp, final_dir);
}

fs::path aside_of(const fs::path& final_dir) { return final_dir.string() + ".old"; }

// A checkpoint of this step already there (a run resumed from before it) is renamed aside rather than deleted
// before the new one takes its name, so that a failed rename can put it back. Returns whether there was one.
bool set_aside(const fs::path& final_dir) {
  if (!fs::exists(final_dir)) return false;
  fs::remove_all(aside_of(final_dir));  // left by a save interrupted between two renames; final_dir is newer
  fs::rename(final_dir, aside_of(final_dir));
  return true;
}

// The rename of `tmp` to `final_dir` is the commit point: before it the checkpoint is invisible, after it
// complete. When it fails, the earlier checkpoint goes back and the new one, complete, stays in `tmp` for the
// user to rename by hand: a failed save never costs an existing checkpoint.
void publish(const fs::path& tmp, const fs::path& final_dir, bool replacing, const StorageFaults& faults) {
  const fs::path aside = aside_of(final_dir);
  try {
    rename_into_place(tmp, final_dir, faults);
  } catch (const std::exception& e) {
    std::error_code ec;
    if (replacing) fs::rename(aside, final_dir, ec);
    const std::string earlier = !replacing ? ""
                                : ec       ? "the earlier checkpoint is in " + aside.string() + ", "
                                           : "the earlier checkpoint is kept, ";
    throw Error(std::string(e.what()) + "; " + earlier + "the new one is complete in " + tmp.string());
  }
  std::error_code ec;
  fs::remove_all(aside, ec);  // the new checkpoint is in place; a failure here leaves only used space
}

// Deletes all but the newest `keep_last` complete checkpoints (0 keeps all).
void prune(const fs::path& root, int keep_last) {
  if (keep_last <= 0) return;
  std::vector<fs::path> complete;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.rfind("step_", 0) == 0 && name.find('.') == std::string::npos)
      complete.push_back(entry.path());
  }
  std::sort(complete.begin(), complete.end());
  for (size_t i = 0; i + keep_last < complete.size(); ++i) fs::remove_all(complete[i]);
}

}  // namespace

std::string checksum_of(const at::Tensor& t) {
  at::Tensor c = t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  uint64_t h = 1469598103934665603ULL;
  for (int64_t i = 0, n = c.numel() * static_cast<int64_t>(c.element_size()); i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ULL;
  }
  std::ostringstream out;
  out << std::hex << std::setw(16) << std::setfill('0') << h;
  return out.str();
}

nlohmann::json records_to_json(const std::vector<PieceRecord>& records) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& r : records)
    out.push_back({{"file", r.file}, {"key", r.key}, {"tensor", r.tensor}, {"param", r.param}, {"dtype", r.dtype},
                   {"checksum", r.checksum}, {"global_shape", r.global_shape}, {"shard_shape", r.shard_shape},
                   {"tp_rank", r.tp_rank}, {"tp_size", r.tp_size}, {"offset", r.offset}, {"numel", r.numel}});
  return out;
}

std::vector<PieceRecord> records_from_json(const nlohmann::json& j) {
  std::vector<PieceRecord> out;
  for (const auto& e : j) {
    PieceRecord r;
    r.file = e.at("file").get<std::string>();
    r.key = e.at("key").get<std::string>();
    r.tensor = e.at("tensor").get<std::string>();
    r.param = e.at("param").get<std::string>();
    r.dtype = e.at("dtype").get<std::string>();
    r.checksum = e.at("checksum").get<std::string>();
    r.global_shape = e.at("global_shape").get<std::vector<int64_t>>();
    r.shard_shape = e.at("shard_shape").get<std::vector<int64_t>>();
    r.tp_rank = e.at("tp_rank").get<int>();
    r.tp_size = e.at("tp_size").get<int>();
    r.offset = e.at("offset").get<int64_t>();
    r.numel = e.at("numel").get<int64_t>();
    out.push_back(std::move(r));
  }
  return out;
}

std::string step_dir_name(int64_t step) {
  std::ostringstream out;
  out << "step_" << std::setw(8) << std::setfill('0') << step;
  return out.str();
}

std::string temp_checkpoint_dir(const std::string& run_dir, int64_t step) {
  return (fs::path(run_dir) / "checkpoints" / (step_dir_name(step) + ".tmp")).string();
}

std::string final_checkpoint_dir(const std::string& run_dir, int64_t step) {
  return (fs::path(run_dir) / "checkpoints" / step_dir_name(step)).string();
}

void discard_checkpoint_attempt(const std::string& run_dir, int64_t step, const StorageFaults& faults) {
  slow_storage_fault(faults);
  std::error_code ec;
  fs::remove_all(temp_checkpoint_dir(run_dir, step), ec);
}

std::string piece_file_name(int rank) {
  std::ostringstream file;
  file << "rank-" << std::setw(5) << std::setfill('0') << rank << ".safetensors";
  return file.str();
}

std::vector<PieceRecord> write_pieces(const std::string& tmp_dir, int rank, const std::vector<Piece>& pieces,
                                     const StorageFaults& faults) {
  std::vector<PieceRecord> records;
  if (pieces.empty()) return records;
  const std::string file = piece_file_name(rank);
  std::vector<NamedTensor> tensors;
  std::map<std::string, std::string> metadata{{"format", "crosstrain-pieces"}};
  for (const auto& p : pieces) {
    PieceRecord r;
    r.file = file;
    r.key = p.tensor + "@tp" + std::to_string(p.tp_rank) + "@" + std::to_string(p.offset);
    r.tensor = p.tensor;
    r.param = p.param;
    r.dtype = dtype_name(p.data.scalar_type());
    r.checksum = checksum_of(p.data);
    r.global_shape = p.global_shape;
    r.shard_shape = p.shard_shape;
    r.tp_rank = p.tp_rank;
    r.tp_size = p.tp_size;
    r.offset = p.offset;
    r.numel = p.data.numel();
    metadata["checksum." + r.key] = r.checksum;
    tensors.push_back({r.key, p.data.reshape(-1)});
    records.push_back(std::move(r));
  }
  fs::create_directories(tmp_dir);
  const fs::path path = fs::path(tmp_dir) / file;
  write_safetensors(path.string(), tensors, metadata);
  fsync_path(path);
  slow_storage_fault(faults);  // for the crash-during-save tests: this rank's file is written, the save not done
  return records;
}

std::string commit_checkpoint(const std::string& run_dir, int64_t step, const std::vector<PieceRecord>& records,
                              const nlohmann::json& info, int keep_last, const StorageFaults& faults,
                              const std::string& source_dir) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  const fs::path tmp = source_dir.empty() ? fs::path(temp_checkpoint_dir(run_dir, step)) : fs::path(source_dir);
  const fs::path final_dir = final_checkpoint_dir(run_dir, step);
  fs::create_directories(tmp);
  // Files of an earlier, interrupted attempt at this step (another layout) are not part of this checkpoint.
  std::set<std::string> used;
  for (const auto& r : records) used.insert(r.file);
  for (const auto& entry : fs::directory_iterator(tmp))
    if (!used.count(entry.path().filename().string())) fs::remove_all(entry.path());
  nlohmann::json manifest = {{"format", "crosstrain-distributed-checkpoint"},
                             {"format_version", kFormatVersion},
                             {"step", step},
                             {"info", info},
                             {"pieces", records_to_json(records)}};
  bool replacing = false;
  try {
    write_synced(tmp / kManifest, manifest.dump(1) + "\n");
    fsync_path(tmp);
    replacing = set_aside(final_dir);
  } catch (const std::exception&) {
    // Uncommitted, the directory is no checkpoint, only used space (which may be what ran out).
    if (source_dir.empty()) {
      discard_checkpoint_attempt(run_dir, step, faults);
    } else {
      std::error_code ec;
      fs::remove_all(tmp, ec);
    }
    throw;
  }
  publish(tmp, final_dir, replacing, faults);
  fsync_path(root);
  prune(root, keep_last);
  return final_dir.string();
}

std::optional<std::string> latest_checkpoint(const std::string& run_dir) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return std::nullopt;
  std::optional<std::string> best;
  for (const auto& entry : fs::directory_iterator(root)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.rfind("step_", 0) != 0 || name.find('.') != std::string::npos) continue;
    if (!best || name > fs::path(*best).filename().string()) best = entry.path().string();
  }
  return best;
}

std::string intact_checkpoint_hint(const std::string& run_dir, const std::string& broken) {
  const fs::path root = fs::path(run_dir) / "checkpoints";
  std::vector<std::string> older;  // complete checkpoints older than the broken one, newest first
  std::error_code ec;
  if (fs::is_directory(root, ec))
    for (const auto& entry : fs::directory_iterator(root, ec)) {
      const std::string name = entry.path().filename().string();
      if (entry.is_directory(ec) && name.rfind("step_", 0) == 0 && name.find('.') == std::string::npos &&
          name < fs::path(broken).filename().string())
        older.push_back(entry.path().string());
    }
  std::sort(older.rbegin(), older.rend());
  // A name with a dot is not a checkpoint to latest_checkpoint: moving the broken ones aside keeps them.
  auto move_aside = [](const std::string& dir) {
    return "mv " + shell_quote(dir) + " " + shell_quote(dir + ".broken");
  };
  std::string moves = move_aside(broken);
  for (const auto& dir : older) {
    try {
      CheckpointReader reader(dir);
      reader.verify(true);
      return "the newest intact checkpoint is " + dir + " (step " + std::to_string(reader.step()) +
             "); to resume from it, move the broken one aside (" + moves + ") and run again with --resume";
    } catch (const std::exception&) {
      // Whatever broke it (a bad manifest, an unreadable file, a tensor libtorch refuses), it is no place to
      // resume from; the hint must not replace the error it explains.
      moves += "; " + move_aside(dir);
    }
  }
  return "no intact checkpoint is left in " + root.string() + "; start afresh with another run.dir";
}

std::string resolve_checkpoint(const std::string& path) {
  std::error_code ec;
  if (fs::exists(fs::path(path) / kManifest, ec)) return path;
  if (auto latest = latest_checkpoint(path)) return *latest;
  if (!fs::exists(path, ec)) throw UsageError("checkpoint '" + path + "' does not exist");
  throw UsageError("'" + path + "' is neither a checkpoint (no " + kManifest + ") nor a run directory with checkpoints");
}

struct CheckpointReader::Reader {
  explicit Reader(const std::string& path) : file(path) {}
  SafetensorsReader file;
};

CheckpointReader::CheckpointReader(const std::string& dir) : dir_(dir) {
  const fs::path file = fs::path(dir) / kManifest;
  std::error_code ec;
  if (!fs::exists(file, ec)) {
    if (fs::exists(fs::path(dir) / "state.json", ec))
      throw UsageError("checkpoint '" + dir + "' has the older per-shard format (state.json); this build reads "
                       "distributed checkpoints (manifest.json) only");
    throw UsageError("checkpoint '" + dir + "' is incomplete: " + file.string() + " is missing");
  }
  try {
    std::ifstream in(file);
    nlohmann::json m = nlohmann::json::parse(in);
    if (m.value("format", "") != "crosstrain-distributed-checkpoint")
      throw UsageError("'" + file.string() + "' is not a crosstrain checkpoint manifest");
    if (m.value("format_version", 0) != kFormatVersion)
      throw UsageError("checkpoint manifest '" + file.string() + "' has format version " +
                       std::to_string(m.value("format_version", 0)) + ", this build reads " + std::to_string(kFormatVersion));
    step_ = m.at("step").get<int64_t>();
    info_ = m.at("info");
    for (auto& r : records_from_json(m.at("pieces"))) tensors_[r.tensor].push_back(std::move(r));
  } catch (const nlohmann::json::exception& e) {
    throw UsageError("checkpoint manifest '" + file.string() + "' is corrupt: " + e.what());
  }
  for (auto& [tensor, pieces] : tensors_) check_pieces(tensor, pieces, file.string());
  for (const auto& f : files())
    if (!fs::exists(fs::path(dir) / f, ec))
      throw UsageError("checkpoint '" + dir + "' is incomplete: " + (fs::path(dir) / f).string() + " is missing");
}

CheckpointReader::~CheckpointReader() = default;

std::vector<std::string> CheckpointReader::tensors() const {
  std::vector<std::string> out;
  for (const auto& [name, pieces] : tensors_) out.push_back(name);
  return out;
}

std::vector<int64_t> CheckpointReader::global_shape(const std::string& tensor) const {
  return tensors_.at(tensor).front().global_shape;
}

std::string CheckpointReader::dtype(const std::string& tensor) const { return tensors_.at(tensor).front().dtype; }

std::string CheckpointReader::describe(const std::string& tensor) const {
  const auto& pieces = tensors_.at(tensor);
  return "tp=" + std::to_string(pieces.front().tp_size) + ", " + std::to_string(pieces.size()) + " piece" +
         (pieces.size() == 1 ? "" : "s");
}

std::vector<std::string> CheckpointReader::files() const {
  std::set<std::string> names;
  for (const auto& [t, pieces] : tensors_)
    for (const auto& p : pieces) names.insert(p.file);
  return {names.begin(), names.end()};
}

int64_t CheckpointReader::stored_bytes() const {
  int64_t bytes = 0;
  std::error_code ec;
  for (const auto& f : files()) bytes += static_cast<int64_t>(fs::file_size(fs::path(dir_) / f, ec));
  return bytes;
}

int64_t CheckpointReader::verify(bool checksums) {
  int64_t pieces = 0;
  for (const auto& [tensor, records] : tensors_)
    for (const auto& p : records) {
      const std::string path = (fs::path(dir_) / p.file).string();
      auto& reader = open_[p.file];
      if (!reader) reader = std::make_unique<Reader>(path);  // checks the header against the file's size
      if (!reader->file.has(p.key))
        throw UsageError("checkpoint file '" + path + "' lacks '" + p.key + "' listed in the manifest (from another checkpoint?)");
      if (reader->file.numel(p.key) != p.numel)
        throw UsageError("checkpoint file '" + path + "': '" + p.key + "' has " + std::to_string(reader->file.numel(p.key)) +
                         " elements but the manifest records " + std::to_string(p.numel) + " (corrupt)");
      if (checksums && checksum_of(reader->file.read(p.key)) != p.checksum)
        throw UsageError("checkpoint file '" + path + "': '" + p.key +
                         "' does not match its checksum in the manifest (corrupt)");
      ++pieces;
    }
  return pieces;
}

at::Tensor CheckpointReader::read_full(const std::string& tensor, const SplitFn& split) {
  auto it = tensors_.find(tensor);
  if (it == tensors_.end()) throw UsageError("checkpoint '" + dir_ + "' has no tensor '" + tensor + "'");
  const auto& pieces = it->second;
  const PieceRecord& first = pieces.front();
  const int tp_size = first.tp_size;
  const int64_t shard_numel = numel_of(first.shard_shape);
  const fs::path manifest = fs::path(dir_) / kManifest;
  // Each tensor-parallel shard, flat, from its pieces; every element exactly once.
  std::vector<at::Tensor> shards(tp_size);
  std::vector<int64_t> covered(tp_size, 0);
  // First every piece against its file's header (cheap), so that what is allocated below is what the files hold,
  // not what a manifest claims.
  for (const auto& p : pieces) {
    auto& reader = open_[p.file];
    if (!reader) reader = std::make_unique<Reader>((fs::path(dir_) / p.file).string());
    if (!reader->file.has(p.key))
      throw UsageError("checkpoint file '" + (fs::path(dir_) / p.file).string() + "' lacks '" + p.key +
                       "' listed in the manifest (from another checkpoint?)");
    if (reader->file.numel(p.key) != p.numel)
      throw UsageError("checkpoint file '" + (fs::path(dir_) / p.file).string() + "': '" + p.key + "' has " +
                       std::to_string(reader->file.numel(p.key)) + " elements but the manifest (" + manifest.string() +
                       ") records " + std::to_string(p.numel) + " (corrupt)");
  }
  for (const auto& p : pieces) {
    auto& reader = open_[p.file];
    at::Tensor data = reader->file.read(p.key).reshape(-1);
    if (data.numel() != p.numel || checksum_of(data) != p.checksum)
      throw UsageError("checkpoint file '" + (fs::path(dir_) / p.file).string() + "': '" + p.key +
                       "' does not match its checksum in the manifest (corrupt)");
    at::Tensor& shard = shards[p.tp_rank];
    if (!shard.defined()) shard = at::empty({shard_numel}, data.options());
    shard.narrow(0, p.offset, p.numel).copy_(data);
    covered[p.tp_rank] += p.numel;
  }
  for (int t = 0; t < tp_size; ++t)
    if (covered[t] != shard_numel)
      throw UsageError("checkpoint '" + dir_ + "' is incomplete: tensor-parallel shard " + std::to_string(t) + " of '" +
                       tensor + "' has " + std::to_string(covered[t]) + " of " + std::to_string(shard_numel) + " elements");
  if (tp_size == 1) return shards[0].view(first.global_shape);
  // Invert the split: where each shard's elements sit in the full tensor.
  at::Tensor index = at::arange(numel_of(first.global_shape), at::kLong).view(first.global_shape);
  at::Tensor full = at::empty({numel_of(first.global_shape)}, shards[0].options());
  for (int t = 0; t < tp_size; ++t) {
    at::Tensor where = split(first.param, index, t, tp_size).reshape(-1);
    if (where.numel() != shard_numel)
      throw UsageError("checkpoint '" + dir_ + "': '" + tensor + "' was split into shards of " + c10::str(c10::IntArrayRef(first.shard_shape)) +
                       ", which does not match this model's split (another model?)");
    full.index_copy_(0, where, shards[t]);
  }
  return full.view(first.global_shape);
}

}  // namespace crosstrain::checkpoint
