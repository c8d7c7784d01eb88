// Distributed checkpoints as a user meets them: asynchronous saves, keeping the newest K, a rank killed in the
// middle of a save, bad checkpoints refused with the file named, and `crosstrain ckpt info|export`.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <regex>
#include <thread>

#include "cli_fixture.h"
#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/core/fence.h"
#include "crosstrain/train/checkpoint.h"
#include "crosstrain/train/checkpoint_sites.h"

using namespace crosstrain::testing;
namespace fs = std::filesystem;
using std::chrono::milliseconds;

namespace {

std::vector<std::string> step_dirs(const std::string& run_dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(fs::path(run_dir) / "checkpoints")) out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

// The ranks a launcher started: its child processes.
std::vector<int> children_of(int pid) {
  std::vector<int> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(e.path() / "stat");
    std::string stat;
    std::getline(in, stat);
    auto close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 2));
    char state;
    int ppid = 0;
    rest >> state >> ppid;
    if (ppid == pid) out.push_back(std::stoi(name));
  }
  return out;
}

}  // namespace

TEST(Checkpoints, AsyncSavesKeepTheNewestAndResumeExactlyInAnotherLayout) {
  auto full = fresh_dir("ckpt_async_full"), part = fresh_dir("ckpt_async_part");
  auto r = run_process(with(tiny_args(full, 2, 12), {"--set", "parallel.zero=2", "--set", "train.checkpoint_every=3",
                                                     "--set", "train.keep_checkpoints=2", "--set", "train.async_checkpoint=true"}),
                       {}, milliseconds(180000));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_EQ(step_dirs(full), (std::vector<std::string>{"step_00000009", "step_00000012"}));
  auto rows = read_metrics(full);
  ASSERT_EQ(rows.size(), 12u);
  EXPECT_TRUE(rows[3].contains("checkpoint_s"));
  // Resume the asynchronously written step-9 checkpoint on one plain rank.
  fs::create_directories(fs::path(part) / "checkpoints");
  fs::copy(fs::path(full) / "checkpoints" / "step_00000009", fs::path(part) / "checkpoints" / "step_00000009");
  auto r2 = run_process(with(tiny_args(part, 1, 12), {"--resume"}), {}, milliseconds(180000));
  ASSERT_EQ(r2.exit_code(), 0) << r2.output;
  EXPECT_TRUE(contains(r2.output, "saved with dp=2 pp=1 tp=1 zero=2")) << r2.output;
  auto resumed = read_metrics(part);
  ASSERT_EQ(resumed.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(resumed[i]["step"], rows[9 + i]["step"]);
    const double a = resumed[i]["loss"], b = rows[9 + i]["loss"];
    EXPECT_NEAR(a, b, 1e-4 * std::abs(b)) << "step " << 10 + i;
  }
}

TEST(Checkpoints, ARankKilledDuringASaveLeavesThePreviousCheckpointIntact) {
  auto dir = fresh_dir("ckpt_crash");
  // Every save takes 3 s after writing its file: time enough to kill a rank in the middle of the second one.
  Process job(with(tiny_args(dir, 2, 10), {"--set", "train.checkpoint_every=5", "--set", "parallel.zero=1", "--set",
                                          "debug.fault_save_delay_ms=3000"}));
  const auto tmp = fs::path(dir) / "checkpoints" / "step_00000010.tmp";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (!fs::exists(tmp / "rank-00001.safetensors") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(milliseconds(20));
  ASSERT_TRUE(fs::exists(tmp)) << "the step-10 save never started";
  auto ranks = children_of(job.pid());
  ASSERT_FALSE(ranks.empty());
  ::kill(ranks.back(), SIGKILL);
  auto res = job.wait(milliseconds(60000));
  EXPECT_NE(res.exit_code(), 0) << res.output;
  EXPECT_FALSE(res.timed_out);
  // Step 10 is not visible; step 5 is complete and loads.
  EXPECT_FALSE(fs::exists(fs::path(dir) / "checkpoints" / "step_00000010"));
  ASSERT_TRUE(fs::exists(fs::path(dir) / "checkpoints" / "step_00000005" / "manifest.json"));
  auto info = run_process({kBin, "ckpt", "info", dir}, {}, milliseconds(60000));
  ASSERT_EQ(info.exit_code(), 0) << info.output;
  EXPECT_TRUE(contains(info.output, "step_00000005")) << info.output;
  auto resumed = run_process(with(tiny_args(dir, 2, 10), {"--set", "train.checkpoint_every=5", "--resume"}), {},
                             milliseconds(180000));
  ASSERT_EQ(resumed.exit_code(), 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "resumed from")) << resumed.output;
  EXPECT_EQ(step_dirs(dir), (std::vector<std::string>{"step_00000005", "step_00000010"}));
}

TEST(Checkpoints, BadCheckpointsAreRefusedNamingTheFileAndNothingTrains) {
  auto dir = fresh_dir("ckpt_bad");
  auto ok = run_process(tiny_args(dir, 1, 2), {}, milliseconds(60000));
  ASSERT_EQ(ok.exit_code(), 0) << ok.output;
  const auto ckpt = fs::path(dir) / "checkpoints" / "step_00000002";
  auto refused = [&](const std::vector<std::string>& extra, const std::string& expect) {
    auto res = run_process(with(tiny_args(dir, 1, 4), with({"--resume"}, extra)), {}, milliseconds(60000));
    EXPECT_NE(res.exit_code(), 0) << res.output;
    EXPECT_TRUE(contains(res.output, expect)) << "expected '" << expect << "' in:\n" << res.output;
    EXPECT_FALSE(contains(res.output, "step 3/")) << res.output;
    EXPECT_EQ(read_metrics(dir).size(), 2u);
  };
  // Another model configuration.
  refused({"--set", "model.n_embd=64"}, "model.n_embd: 32 -> 64");
  refused({"--set", "model.n_layer=3"}, "model.n_layer: 2 -> 3");
  // A manifest that lists a file that is gone.
  fs::copy(ckpt / "rank-00000.safetensors", fs::path(dir) / "saved.safetensors");
  fs::remove(ckpt / "rank-00000.safetensors");
  refused({}, (ckpt / "rank-00000.safetensors").string() + " is missing");
  fs::copy(fs::path(dir) / "saved.safetensors", ckpt / "rank-00000.safetensors");
  // A corrupt manifest.
  fs::copy(ckpt / "manifest.json", fs::path(dir) / "manifest.saved");
  fs::resize_file(ckpt / "manifest.json", 200);
  refused({}, (ckpt / "manifest.json").string());
  fs::copy(fs::path(dir) / "manifest.saved", ckpt / "manifest.json", fs::copy_options::overwrite_existing);
  auto fine = run_process(with(tiny_args(dir, 1, 4), {"--resume"}), {}, milliseconds(60000));
  EXPECT_EQ(fine.exit_code(), 0) << fine.output;
}

TEST(Checkpoints, ExportWritesOneSafetensorsFileByTheFormatSpecification) {
  auto tp2 = fresh_dir("ckpt_export_tp2"), tp1 = fresh_dir("ckpt_export_tp1");
  auto a = run_process(with(tiny_args(tp2, 2, 3), {"--set", "parallel.tp=2"}), {}, milliseconds(120000));
  ASSERT_EQ(a.exit_code(), 0) << a.output;
  auto b = run_process(tiny_args(tp1, 1, 3), {}, milliseconds(120000));
  ASSERT_EQ(b.exit_code(), 0) << b.output;
  auto info = run_process({kBin, "ckpt", "info", tp2, "--tensors"}, {}, milliseconds(60000));
  ASSERT_EQ(info.exit_code(), 0) << info.output;
  EXPECT_TRUE(contains(info.output, "dp=1 pp=1 tp=2 zero=0")) << info.output;
  EXPECT_TRUE(contains(info.output, "h.1.mlp.c_fc.weight")) << info.output;

  // Read the exported files with nothing but the specification: 8-byte little-endian header size, a JSON
  // header of {name: {dtype, shape, data_offsets}} (+ __metadata__), then the data, offsets relative to it.
  auto read = [&](const std::string& run_dir, const std::string& out) {
    auto res = run_process({kBin, "ckpt", "export", run_dir, out}, {}, milliseconds(60000));
    EXPECT_EQ(res.exit_code(), 0) << res.output;
    std::ifstream in(out, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
    auto header = nlohmann::json::parse(bytes.substr(8, n));
    const size_t data = 8 + n;
    std::map<std::string, std::vector<float>> tensors;
    std::vector<std::pair<int64_t, int64_t>> spans;
    for (auto& [name, e] : header.items()) {
      if (name == "__metadata__") continue;
      EXPECT_EQ(e["dtype"], "F32") << name;
      int64_t numel = 1;
      for (int64_t d : e["shape"].get<std::vector<int64_t>>()) numel *= d;
      auto off = e["data_offsets"].get<std::vector<int64_t>>();
      EXPECT_EQ(off[1] - off[0], numel * 4) << name;
      spans.push_back({off[0], off[1]});
      std::vector<float> v(numel);
      std::memcpy(v.data(), bytes.data() + data + off[0], numel * 4);
      tensors[name] = v;
    }
    // The data buffer is covered exactly, without gaps or overlaps.
    std::sort(spans.begin(), spans.end());
    int64_t end = 0;
    for (auto [s, e] : spans) {
      EXPECT_EQ(s, end);
      end = e;
    }
    EXPECT_EQ(static_cast<size_t>(end), bytes.size() - data);
    EXPECT_EQ(header["wte.weight"]["shape"], (std::vector<int64_t>{256, 32}));
    EXPECT_EQ(header["h.0.attn.c_attn.weight"]["shape"], (std::vector<int64_t>{96, 32}));
    return tensors;
  };
  auto split = read(tp2, tp2 + "/model.safetensors"), whole = read(tp1, tp1 + "/model.safetensors");
  ASSERT_EQ(split.size(), whole.size());
  // The tensor-parallel run's shards, put back together, are the single-rank run's parameters.
  for (const auto& [name, v] : whole) {
    ASSERT_EQ(split[name].size(), v.size()) << name;
    double worst = 0;
    for (size_t i = 0; i < v.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(split[name][i] - v[i])));
    EXPECT_LT(worst, 1e-4) << name;
  }
}

namespace {

// Flips bytes inside the last tensor of a shard file: the file still parses, only its checksum tells.
void corrupt(const fs::path& file) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(fs::file_size(file) - 64));
  f.write("garbage!garbage!", 16);
}

std::vector<std::string> leftovers(const std::string& run_dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::recursive_directory_iterator(run_dir, ec))
    if (e.path().string().find(".tmp") != std::string::npos) out.push_back(e.path().string());
  return out;
}

// A tmpfs of `size` at a fresh folder, unmounted and removed when the test ends however it ends.
struct SmallDisk {
  fs::path dir;
  bool mounted = false;
  SmallDisk(const std::string& name, const std::string& size) : dir(fresh_dir(name)) {
    fs::create_directories(dir);
    mounted = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, ("size=" + size).c_str()) == 0;
  }
  ~SmallDisk() {
    if (mounted) ::umount2(dir.c_str(), MNT_DETACH);
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
};

}  // namespace

TEST(Checkpoints, InfoChecksSizesAndWithVerifyChecksumsAndFailsOnABrokenShard) {
  auto dir = fresh_dir("ckpt_info_verify");
  auto ok = run_process(with(tiny_args(dir, 1, 2), {"--set", "train.checkpoint_every=1"}), {}, milliseconds(60000));
  ASSERT_EQ(ok.exit_code(), 0) << ok.output;
  const auto newest = fs::path(dir) / "checkpoints" / "step_00000002";
  const auto shard = newest / "rank-00000.safetensors";
  auto info = run_process({kBin, "ckpt", "info", dir}, {}, milliseconds(60000));
  ASSERT_EQ(info.exit_code(), 0) << info.output;
  EXPECT_TRUE(contains(info.output, "checksums NOT verified (add --verify")) << info.output;
  info = run_process({kBin, "ckpt", "info", dir, "--verify"}, {}, milliseconds(60000));
  ASSERT_EQ(info.exit_code(), 0) << info.output;
  EXPECT_TRUE(contains(info.output, "verified: sizes and checksums of")) << info.output;

  // Corrupted: only reading the pieces can tell, and --verify does.
  fs::copy(shard, fs::path(dir) / "saved.safetensors");
  corrupt(shard);
  info = run_process({kBin, "ckpt", "info", newest.string(), "--verify"}, {}, milliseconds(60000));
  EXPECT_NE(info.exit_code(), 0) << info.output;
  EXPECT_TRUE(contains(info.output, shard.string() + "'")) << info.output;
  EXPECT_TRUE(contains(info.output, "checksum")) << info.output;
  EXPECT_FALSE(contains(info.output, "parameters")) << "no summary for a broken checkpoint:\n" << info.output;
  // Given the run directory, the error also names the newest intact checkpoint.
  info = run_process({kBin, "ckpt", "info", dir, "--verify"}, {}, milliseconds(60000));
  EXPECT_NE(info.exit_code(), 0) << info.output;
  EXPECT_TRUE(contains(info.output, "the newest intact checkpoint is " + dir + "/checkpoints/step_00000001"))
      << info.output;

  // Truncated: the sizes, checked always, tell.
  fs::copy(fs::path(dir) / "saved.safetensors", shard, fs::copy_options::overwrite_existing);
  fs::resize_file(shard, fs::file_size(shard) - 1000);
  info = run_process({kBin, "ckpt", "info", newest.string()}, {}, milliseconds(60000));
  EXPECT_NE(info.exit_code(), 0) << info.output;
  EXPECT_TRUE(contains(info.output, shard.string())) << info.output;
  EXPECT_TRUE(contains(info.output, "truncated")) << info.output;
  fs::copy(fs::path(dir) / "saved.safetensors", shard, fs::copy_options::overwrite_existing);
  info = run_process({kBin, "ckpt", "info", newest.string()}, {}, milliseconds(60000));
  EXPECT_EQ(info.exit_code(), 0) << info.output;
}

TEST(Checkpoints, ABrokenNewestCheckpointNamesTheNewestIntactOneAndHowToResumeFromIt) {
  auto dir = fresh_dir("ckpt_newest_broken");
  auto args = with(tiny_args(dir, 1, 3), {"--set", "train.checkpoint_every=1"});
  auto ok = run_process(args, {}, milliseconds(60000));
  ASSERT_EQ(ok.exit_code(), 0) << ok.output;
  const auto root = fs::path(dir) / "checkpoints";
  corrupt(root / "step_00000003" / "rank-00000.safetensors");
  fs::resize_file(root / "step_00000002" / "rank-00000.safetensors", 100);
  auto refused = run_process(with(args, {"--resume", "--set", "train.steps=5"}), {}, milliseconds(60000));
  EXPECT_NE(refused.exit_code(), 0) << refused.output;
  EXPECT_EQ(std::count(refused.output.begin(), refused.output.end(), '\n'), 1) << refused.output;
  EXPECT_TRUE(contains(refused.output, "the newest intact checkpoint is " + (root / "step_00000001").string() +
                                           " (step 1)"))
      << refused.output;
  const std::string mv3 = "mv '" + (root / "step_00000003").string() + "' '" + (root / "step_00000003").string() + ".broken'";
  const std::string mv2 = "mv '" + (root / "step_00000002").string() + "' '" + (root / "step_00000002").string() + ".broken'";
  EXPECT_TRUE(contains(refused.output, mv3 + "; " + mv2)) << refused.output;
  EXPECT_EQ(read_metrics(dir).size(), 3u);  // nothing trained, nothing destroyed
  EXPECT_TRUE(fs::exists(root / "step_00000003"));
  // Doing what it says works.
  fs::rename(root / "step_00000003", root / "step_00000003.broken");
  fs::rename(root / "step_00000002", root / "step_00000002.broken");
  auto resumed = run_process(with(args, {"--resume", "--set", "train.steps=5"}), {}, milliseconds(60000));
  ASSERT_EQ(resumed.exit_code(), 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "resumed from " + (root / "step_00000001").string())) << resumed.output;
}

TEST(Checkpoints, AFullDiskLeavesNoPartialDirectoryAndNamesTheErrno) {
  // Two ranks write about 270 KB each: on a 400 KiB disk the second file does not fit.
  SmallDisk disk("ckpt_full_disk", "400k");
  if (!disk.mounted) GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << std::strerror(errno);
  const std::string dir = (disk.dir / "run").string();
  auto res = run_process(with(tiny_args(dir, 2, 4), {"--set", "train.checkpoint_every=2"}), {}, milliseconds(60000));
  EXPECT_NE(res.exit_code(), 0) << res.output;
  EXPECT_TRUE(contains(res.output, "checkpoint of step 2 failed")) << res.output;
  EXPECT_TRUE(contains(res.output, std::strerror(ENOSPC))) << res.output;
  EXPECT_TRUE(contains(res.output, ".safetensors")) << res.output;
  EXPECT_TRUE(leftovers(dir).empty()) << leftovers(dir).front();
  EXPECT_FALSE(crosstrain::checkpoint::latest_checkpoint(dir).has_value());
}

TEST(Checkpoints, AFullDiskWhileWritingTheManifestLeavesNoPartialDirectory) {
  SmallDisk disk("ckpt_full_manifest", "256k");
  if (!disk.mounted) GTEST_SKIP() << "cannot mount a tmpfs here (needs root): " << std::strerror(errno);
  const std::string run = (disk.dir / "run").string();
  crosstrain::checkpoint::Piece p;
  p.tensor = p.param = "w";
  p.global_shape = p.shard_shape = {1000};
  p.data = at::arange(1000, at::kFloat);
  auto records = crosstrain::checkpoint::write_pieces(crosstrain::checkpoint::temp_checkpoint_dir(run, 7), 0, {p});
  {
    // Fill the disk to the last byte: the shard is written, the manifest cannot be.
    std::ofstream filler(disk.dir / "filler", std::ios::binary);
    const std::string block(4096, 'x');
    while (filler.write(block.data(), block.size())) {
    }
  }
  std::string what;
  try {
    crosstrain::checkpoint::commit_checkpoint(run, 7, records, {{"step", 7}}, 0);
  } catch (const std::exception& e) {
    what = e.what();
  }
  EXPECT_TRUE(contains(what, "manifest.json")) << what;
  EXPECT_TRUE(contains(what, std::strerror(ENOSPC))) << what;
  EXPECT_FALSE(fs::exists(crosstrain::checkpoint::temp_checkpoint_dir(run, 7)));
  EXPECT_FALSE(fs::exists(crosstrain::checkpoint::final_checkpoint_dir(run, 7)));
}

namespace {

// A one-piece checkpoint of `step` whose info carries `tag`, written and committed by this process with
// `faults` injected.
std::string save_tagged(const std::string& run, int64_t step, const std::string& tag,
                        const crosstrain::checkpoint::StorageFaults& faults = {}) {
  crosstrain::checkpoint::Piece p;
  p.tensor = p.param = "w";
  p.global_shape = p.shard_shape = {16};
  p.data = at::arange(16, at::kFloat);
  auto records =
      crosstrain::checkpoint::write_pieces(crosstrain::checkpoint::temp_checkpoint_dir(run, step), 0, {p}, faults);
  return crosstrain::checkpoint::commit_checkpoint(run, step, records, {{"tag", tag}}, 0, faults);
}

}  // namespace

TEST(Checkpoints, AFailedCommitRenameKeepsTheCheckpointOfThatStep) {
  const std::string run = fresh_dir("ckpt_failed_rename");
  const std::string final_dir = save_tagged(run, 7, "first");
  std::string what = "no error";
  crosstrain::checkpoint::StorageFaults fault;
  fault.commit_rename = true;
  try {
    save_tagged(run, 7, "second", fault);
  } catch (const std::exception& e) {
    what = e.what();
  }
  EXPECT_TRUE(contains(what, "the earlier checkpoint is kept")) << what;
  // The step-7 checkpoint that was there is there still, whole; the new one waits complete in its .tmp.
  crosstrain::checkpoint::CheckpointReader kept(final_dir);
  EXPECT_EQ(kept.info().value("tag", ""), "first");
  EXPECT_EQ(kept.verify(true), 1);
  EXPECT_FALSE(fs::exists(final_dir + ".old"));
  const std::string tmp = crosstrain::checkpoint::temp_checkpoint_dir(run, 7);
  EXPECT_TRUE(contains(what, "the new one is complete in " + tmp)) << what;
  EXPECT_EQ(crosstrain::checkpoint::CheckpointReader(tmp).info().value("tag", ""), "second");
  // Without the fault the same save replaces it, and nothing is left beside it.
  save_tagged(run, 7, "third");
  EXPECT_EQ(crosstrain::checkpoint::CheckpointReader(final_dir).info().value("tag", ""), "third");
  EXPECT_EQ(step_dirs(run), (std::vector<std::string>{"step_00000007"}));
}

TEST(Checkpoints, AFailedSaveOnSlowStorageEndsInItsErrorNotABarrierTimeout) {
  const std::string run = fresh_dir("ckpt_slow_cleanup");
  // Every rank's write fails (the temporary directory's name is taken by a file), and removing what is left
  // takes 1.5 s: longer than the 0.3 s the collectives may wait.
  const fs::path tmp = crosstrain::checkpoint::temp_checkpoint_dir(run, 3);
  fs::create_directories(tmp.parent_path());
  std::ofstream(tmp) << "in the way";
  crosstrain::checkpoint::StorageFaults slow;
  slow.save_delay_ms = 1500;
  std::vector<std::string> errors(2);
  crosstrain::comm::FakeWorld::run(
      2,
      [&](crosstrain::comm::Communicator& world) {
        crosstrain::train::CheckpointWriter writer(world, run, 0, false, 0.3, slow);
        crosstrain::checkpoint::Piece p;
        p.tensor = p.param = "w" + std::to_string(world.rank());
        p.global_shape = p.shard_shape = {4};
        p.data = at::ones({4});
        try {
          writer.save(3, {p}, {{"step", 3}});
          writer.commit();
        } catch (const std::exception& e) {
          errors[world.rank()] = e.what();
        }
      },
      milliseconds(300));
  for (const auto& what : errors) {
    EXPECT_TRUE(contains(what, "checkpoint of step 3 failed")) << what;
    EXPECT_FALSE(contains(what, "timeout")) << what;
  }
  EXPECT_FALSE(fs::exists(tmp));
}

// run.fence: a placement whose token no longer names the run folder's FENCE (the scheduler re-placed the job, and
// this gang was cut off and kept running) commits nothing; the owner commits as before.
TEST(Checkpoints, AFencedOffPlacementCommitsNothing) {
  const std::string run = fresh_dir("ckpt_fence");
  auto save_as = [&](const std::string& token, int64_t step) {
    std::vector<std::string> errors(2);
    crosstrain::comm::FakeWorld::run(2, [&](crosstrain::comm::Communicator& world) {
      crosstrain::train::CheckpointWriter writer(world, run, 0, false, 5.0, {}, token);
      crosstrain::checkpoint::Piece p;
      p.tensor = p.param = "w" + std::to_string(world.rank());
      p.global_shape = p.shard_shape = {4};
      p.data = at::ones({4});
      try {
        writer.save(step, {p}, {{"step", step}});
        writer.commit();
      } catch (const std::exception& e) {
        errors[world.rank()] = e.what();
      }
    });
    return errors;
  };
  crosstrain::write_fence(run, "job1.a2");
  const auto owner = save_as("job1.a2", 10);
  EXPECT_EQ(owner[0], "");
  EXPECT_TRUE(fs::exists(fs::path(crosstrain::checkpoint::final_checkpoint_dir(run, 10)) / "manifest.json"));
  const auto old = save_as("job1.a1", 20);
  EXPECT_TRUE(contains(old[0], "fenced off")) << old[0];
  EXPECT_TRUE(contains(old[0], "job1.a2")) << old[0];
  EXPECT_TRUE(contains(old[1], "checkpoint of step 20 failed on rank 0")) << old[1];
  EXPECT_FALSE(fs::exists(crosstrain::checkpoint::final_checkpoint_dir(run, 20))) << "the fenced placement committed";
  EXPECT_FALSE(fs::exists(crosstrain::checkpoint::temp_checkpoint_dir(run, 20))) << "its partial files stayed";
  EXPECT_EQ(*crosstrain::checkpoint::latest_checkpoint(run), crosstrain::checkpoint::final_checkpoint_dir(run, 10));
  // Without a token nothing is fenced (a run the scheduler did not start).
  EXPECT_EQ(save_as("", 30)[0], "");
}

// Sites without a shared disk: no scheduler writes their fence, each rank moves its site's fence forward when it
// starts. A later placement's token replaces an earlier one's; an earlier one never replaces a later one, and is
// told it was fenced off; tokens of another form or job are never taken for later ones.
TEST(Checkpoints, ARankMovesItsSitesFenceForwardNeverBack) {
  const std::string run = fresh_dir("ckpt_fence_advance");
  const auto holder = [&] {
    std::ifstream in(fs::path(run) / "FENCE");
    std::string h;
    std::getline(in, h);
    return h;
  };
  EXPECT_EQ(crosstrain::advance_fence(run, "job4.a2"), "");
  EXPECT_EQ(holder(), "job4.a2");
  EXPECT_EQ(crosstrain::advance_fence(run, "job4.a2"), "");  // the same placement's other ranks
  EXPECT_EQ(crosstrain::advance_fence(run, "job4.a10"), "");  // numbers, not text: 10 is after 2
  EXPECT_EQ(holder(), "job4.a10");
  const std::string old = crosstrain::advance_fence(run, "job4.a9");
  EXPECT_TRUE(contains(old, "fenced off")) << old;
  EXPECT_TRUE(contains(old, "job4.a10")) << old;
  EXPECT_EQ(holder(), "job4.a10");
  EXPECT_FALSE(crosstrain::advance_fence(run, "job5.a11").empty()) << "another job's token took the folder";
  EXPECT_FALSE(crosstrain::advance_fence(run, "mine").empty());
  EXPECT_EQ(holder(), "job4.a10");
  EXPECT_EQ(crosstrain::fence_refusal(run, "job4.a10"), "");
  EXPECT_FALSE(crosstrain::fence_is_later("job4.a", "job4.a1"));
  EXPECT_FALSE(crosstrain::fence_is_later("job4.a3x", "job4.a1"));
  EXPECT_TRUE(crosstrain::fence_is_later("job4.a3", "job4.a1"));
  EXPECT_EQ(crosstrain::advance_fence(run, ""), "");  // no token, no fencing
}

// `crosstrain train` itself moves its run folder's fence (each rank does, at a site no scheduler writes): into an
// empty folder its token goes, and a placement that a later one took over trains nothing there.
TEST(Checkpoints, TrainWritesItsFenceAndAFencedOffPlacementDoesNotTrain) {
  const std::string dir = fresh_dir("ckpt_fence_train");
  auto fresh = run_process(with(tiny_args(dir, 1, 2), {"--set", "run.fence=job1.a2"}), {}, milliseconds(60000));
  ASSERT_EQ(fresh.exit_code(), 0) << fresh.output;
  std::ifstream fence(fs::path(dir) / "FENCE");
  std::string holder;
  std::getline(fence, holder);
  EXPECT_EQ(holder, "job1.a2");
  const std::string taken = fresh_dir("ckpt_fence_taken");
  crosstrain::write_fence(taken, "job1.a3");
  auto old = run_process(with(tiny_args(taken, 1, 2), {"--set", "run.fence=job1.a2"}), {}, milliseconds(60000));
  EXPECT_EQ(old.exit_code(), 2) << old.output;
  EXPECT_TRUE(contains(old.output, "fenced off")) << old.output;
  EXPECT_TRUE(contains(old.output, "job1.a3")) << old.output;
  EXPECT_FALSE(fs::exists(fs::path(taken) / "metrics.jsonl")) << "the fenced-off placement trained";
}

TEST(Checkpoints, TheIntactCheckpointHintSurvivesAnyErrorAndQuotesItsPaths) {
  // A run directory a shell would split and unquote.
  const std::string run = fresh_dir("ckpt hint's $dir");
  save_tagged(run, 1, "intact");
  const std::string poisoned = save_tagged(run, 2, "poisoned");
  const std::string broken = save_tagged(run, 3, "broken");
  {
    // Step 2's file claims 2^62 x 4 floats, which wraps to 0 bytes: it opens, and libtorch refuses to make the
    // tensor when it is checked (a c10::Error, not a UsageError). The manifest is made to agree (0 elements).
    const std::string header =
        R"({"w@tp0@0":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}})";
    std::ofstream file(fs::path(poisoned) / "rank-00000.safetensors", std::ios::binary | std::ios::trunc);
    const uint64_t n = header.size();
    for (int i = 0; i < 8; ++i) file.put(static_cast<char>((n >> (8 * i)) & 0xff));
    file << header;
    std::ifstream in(fs::path(poisoned) / "manifest.json");
    auto manifest = nlohmann::json::parse(in);
    manifest["pieces"][0]["numel"] = 0;
    std::ofstream(fs::path(poisoned) / "manifest.json") << manifest.dump();
  }
  const std::string hint = crosstrain::checkpoint::intact_checkpoint_hint(run, broken);
  EXPECT_TRUE(contains(hint, "the newest intact checkpoint is " + run + "/checkpoints/step_00000001")) << hint;
  // The suggested commands work when pasted into a shell.
  const auto from = hint.find("aside ("), to = hint.find(") and run again");
  ASSERT_TRUE(from != std::string::npos && to != std::string::npos) << hint;
  const std::string moves = hint.substr(from + 7, to - from - 7);
  const std::string script = fresh_dir("ckpt_hint_moves.sh");
  std::ofstream(script) << moves << "\n";
  EXPECT_EQ(std::system(("/bin/sh " + script).c_str()), 0) << moves;
  EXPECT_EQ(step_dirs(run), (std::vector<std::string>{"step_00000001", "step_00000002.broken", "step_00000003.broken"}))
      << moves;
}

TEST(Checkpoints, CtrlCStopsEveryRankBetweenStepsAndSaysHowToResume) {
  auto dir = fresh_dir("ckpt_sigint");
  // Saves take an extra second after their files are written: the interrupt lands in the middle of one.
  auto args = with(tiny_args(dir, 2, 2000), {"--set", "train.checkpoint_every=5"});
  Process job(with(args, {"--set", "debug.fault_save_delay_ms=1000"}));
  const auto tmp = fs::path(dir) / "checkpoints" / "step_00000010.tmp";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!fs::exists(tmp / "rank-00001.safetensors") && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(milliseconds(10));
  ASSERT_TRUE(fs::exists(tmp)) << "the step-10 save never started";
  job.signal(SIGINT);
  auto res = job.wait(milliseconds(60000));
  EXPECT_FALSE(res.timed_out);
  EXPECT_EQ(res.exit_code(), 128 + SIGINT) << res.output;
  // Stopped within two steps of the signal, which came during step 10's save.
  std::smatch stop;
  ASSERT_TRUE(std::regex_search(res.output, stop, std::regex("interrupted \\(SIGINT\\) after step (1[0-2]) of 2000"))) << res.output;
  const int stopped = std::stoi(stop[1]);
  char last[32];
  std::snprintf(last, sizeof last, "step_%08d", stopped);
  // The step it stopped after is saved: nothing is lost.
  EXPECT_TRUE(contains(res.output, "The newest checkpoint is " + dir + "/checkpoints/" + last)) << res.output;
  EXPECT_TRUE(contains(res.output, "continue with: " + std::string(kBin) + " train")) << res.output;
  EXPECT_TRUE(contains(res.output, "--resume")) << res.output;
  EXPECT_FALSE(contains(res.output, "Traceback")) << res.output;
  // The save under way was finished, the stop step saved, nothing is half-written.
  EXPECT_TRUE(leftovers(dir).empty()) << leftovers(dir).front();
  std::vector<std::string> expected{"step_00000005", "step_00000010"};
  if (stopped != 10) expected.push_back(last);
  EXPECT_EQ(step_dirs(dir), expected);
  auto info = run_process({kBin, "ckpt", "info", dir, "--verify"}, {}, milliseconds(60000));
  EXPECT_EQ(info.exit_code(), 0) << info.output;
  auto resumed = run_process(with(args, {"--resume", "--set", "train.steps=14"}), {}, milliseconds(60000));
  ASSERT_EQ(resumed.exit_code(), 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "resumed from " + dir + "/checkpoints/" + last)) << resumed.output;
}

TEST(Checkpoints, SigtermInDiLoCoFinishesTheOuterStepSavesItAndResumesFromIt) {
  auto dir = fresh_dir("ckpt_sigint_diloco");
  // Two clusters of one rank; they meet every 4 inner steps, and only there can they agree to stop.
  auto args = with(tiny_args(dir, 2, 2000), {"--set", "sync.mode=diloco", "--set", "sync.clusters=2", "--set",
                                             "sync.inner_steps=4", "--set", "train.checkpoint_every=1000"});
  Process job(args);
  // Signalled between outer steps, at least 5 steps in; SIGTERM, as a batch system sends before it kills: the same
  // stop as Ctrl-C.
  const auto res = signal_at_step(job, dir, 5, SIGTERM);
  EXPECT_FALSE(res.timed_out);
  EXPECT_EQ(res.exit_code(), 128 + SIGTERM) << res.output;
  const int stopped = stopped_after(res.output, "SIGTERM");
  ASSERT_GE(stopped, 0) << res.output;
  // At an outer step (the clusters hold the same parameters there), and before the run's end.
  EXPECT_EQ(stopped % 4, 0) << res.output;
  EXPECT_GE(stopped, 8) << res.output;
  EXPECT_LT(stopped, 2000) << res.output;
  const std::string last = step_dir_name(stopped);
  EXPECT_TRUE(contains(res.output, "The newest checkpoint is " + dir + "/checkpoints/" + last)) << res.output;
  EXPECT_EQ(step_dirs(dir), std::vector<std::string>{last});
  EXPECT_TRUE(leftovers(dir).empty()) << leftovers(dir).front();
  // The printed command, a few steps longer, continues from that step.
  const auto from = res.output.find("continue with: ");
  ASSERT_NE(from, std::string::npos) << res.output;
  const std::string command = res.output.substr(from + 15, res.output.find('\n', from) - from - 15);
  EXPECT_TRUE(contains(command, "--resume")) << command;
  auto resumed = run_process({"/bin/sh", "-c", command + " --set train.steps=" + std::to_string(stopped + 4)}, {},
                             milliseconds(90000));
  ASSERT_EQ(resumed.exit_code(), 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "resumed from " + dir + "/checkpoints/" + last)) << resumed.output;
}

namespace {

// Ranks that drift apart hear a Ctrl-C every `every` steps and read it as many steps later (ssp, gossip;
// SyncTraits::stop_check), or (every = 0: async) through the parameter server's replies: signalled mid-run, every
// rank stops after the same step (one before a read), saves its replica there, and the printed command continues
// from it.
void ctrl_c_in_drifting_mode(const std::string& mode, int every) {
  auto dir = fresh_dir("ckpt_sigint_" + mode);
  auto args = with(tiny_args(dir, 2, 2000), {"--set", "sync.mode=" + mode, "--set", "train.checkpoint_every=1000"});
  Process job(args);
  const auto res = signal_at_step(job, dir, 5, SIGINT);
  EXPECT_FALSE(res.timed_out) << mode;
  EXPECT_EQ(res.exit_code(), 128 + SIGINT) << res.output;
  const int stopped = stopped_after(res.output, "SIGINT");
  ASSERT_GE(stopped, 0) << res.output;
  if (every > 0) EXPECT_EQ(stopped % every, every - 1) << res.output;
  EXPECT_GE(stopped, 5) << res.output;
  const std::string last = step_dir_name(stopped);
  EXPECT_TRUE(contains(res.output, "The newest checkpoint is " + dir + "/checkpoints/" + last)) << res.output;
  EXPECT_EQ(step_dirs(dir), std::vector<std::string>{last}) << mode;
  EXPECT_TRUE(leftovers(dir).empty()) << leftovers(dir).front();
  const auto from = res.output.find("continue with: ");
  ASSERT_NE(from, std::string::npos) << res.output;
  const std::string command = res.output.substr(from + 15, res.output.find('\n', from) - from - 15);
  auto resumed = run_process({"/bin/sh", "-c", command + " --set train.steps=" + std::to_string(stopped + 3)}, {},
                             milliseconds(90000));
  ASSERT_EQ(resumed.exit_code(), 0) << resumed.output;
  EXPECT_TRUE(contains(resumed.output, "resumed from " + dir + "/checkpoints/" + last)) << resumed.output;
}

}  // namespace

TEST(Checkpoints, CtrlCInSspStopsEveryRankAfterTheSameStepAndSavesIt) { ctrl_c_in_drifting_mode("ssp", 5); }
TEST(Checkpoints, CtrlCInAsyncStopsEveryRankAfterTheSameStepAndSavesIt) { ctrl_c_in_drifting_mode("async", 0); }
TEST(Checkpoints, CtrlCInGossipStopsEveryRankAfterTheSameStepAndSavesIt) { ctrl_c_in_drifting_mode("gossip", 4); }

namespace {

// Node `node` of a 2-node job (one rank each) whose run folder is on storage of its own (run.site): no file
// system is shared. `sites = false`: the same folders, but run.site unset (as if they were one file system).
std::vector<std::string> site_node(int node, int port, const std::string& dir, bool sites, int steps,
                                   const std::vector<std::string>& extra = {}) {
  std::vector<std::string> train = tiny_args(dir, 1, steps);
  train.insert(train.end(), {"--set", "train.checkpoint_every=5", "--set", "train.eval_every=0"});
  if (sites) train.insert(train.end(), {"--set", std::string("run.site=") + (node == 0 ? "east" : "west")});
  train.insert(train.end(), extra.begin(), extra.end());
  return two_node_run(node, port, train);
}

std::string run_two_sites(const std::string& east, const std::string& west, bool sites, int steps) {
  const int port = free_port();
  Process node0(site_node(0, port, east, sites, steps)), node1(site_node(1, port, west, sites, steps));
  auto r0 = node0.wait(milliseconds(120000));
  auto r1 = node1.wait(milliseconds(30000));
  if (r0.exit_code() == 0 && r1.exit_code() == 0) return "";
  return r0.output + "\n--- node 1 ---\n" + r1.output;
}

}  // namespace

// Pure: ranks with the same site share storage; each site's lowest rank leads it.
TEST(Checkpoints, SiteMapGroupsRanksBySiteAndLeadsEachWithItsLowestRank) {
  const crosstrain::train::SiteMap m = crosstrain::train::site_map({5, 7, 5, 9, 7});
  EXPECT_EQ(m.sites(), 3);
  EXPECT_EQ(m.site_of, (std::vector<int>{0, 1, 0, 2, 1}));
  EXPECT_EQ(m.leaders, (std::vector<int>{0, 1, 3}));
  EXPECT_TRUE(m.leads(3));
  EXPECT_FALSE(m.leads(4));
  EXPECT_EQ(crosstrain::train::site_map({1, 1, 1}).sites(), 1) << "one shared file system";
}

// Two sites that share no file system (run.site): each rank writes its half of every checkpoint at its own site,
// the halves cross over the job's connections (in the background), and both sites commit the whole checkpoint; the
// run's metrics follow. Either site alone then
// resumes the run (here west's, on one rank: the checkpoint reshards); the step-10 state is the same at both. Without
// run.site the west folder holds only its rank's file and no manifest.
TEST(Checkpoints, SitesWithoutASharedFileSystemEachCommitTheWholeCheckpoint) {
  const std::string east = fresh_dir("ckpt_site_east"), west = fresh_dir("ckpt_site_west");
  ASSERT_EQ(run_two_sites(east, west, true, 10), "");
  for (const std::string& site : {east, west})
    for (int64_t step : {5, 10}) {
      const fs::path dir = crosstrain::checkpoint::final_checkpoint_dir(site, step);
      EXPECT_TRUE(fs::exists(dir / "manifest.json")) << dir;
      EXPECT_TRUE(fs::exists(dir / crosstrain::checkpoint::piece_file_name(0))) << dir;
      EXPECT_TRUE(fs::exists(dir / crosstrain::checkpoint::piece_file_name(1))) << dir;
    }
  // Rank 0 writes the run's outputs at its site; they follow the checkpoints to the other (the same bytes).
  EXPECT_EQ(crosstrain::train::file_checksum((fs::path(west) / "metrics.jsonl").string()),
            crosstrain::train::file_checksum((fs::path(east) / "metrics.jsonl").string()));
  EXPECT_EQ(read_metrics(west).size(), 10u) << "the staged metrics hold all 10 steps";
  // The same bytes at both sites.
  const auto ten = [](const std::string& site, int rank) {
    return crosstrain::train::file_checksum(
        (fs::path(crosstrain::checkpoint::final_checkpoint_dir(site, 10)) / crosstrain::checkpoint::piece_file_name(rank))
            .string());
  };
  for (int rank : {0, 1}) EXPECT_EQ(ten(east, rank), ten(west, rank)) << "rank " << rank;
  // West alone resumes from its own copy.
  std::vector<std::string> resume = tiny_args(west, 1, 12);
  resume.insert(resume.end(), {"--set", "train.eval_every=0", "--resume"});
  const auto r = run_process(resume, {}, milliseconds(120000));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_TRUE(contains(r.output, "step 10")) << r.output;
  // Resumed after step 10, on the history staged from east: every step once.
  const auto rows = read_metrics(west);
  ASSERT_EQ(rows.size(), 12u);
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(rows[i]["step"].get<int64_t>(), static_cast<int64_t>(i + 1));

  // The control: the same folders without run.site leave west without a checkpoint it could load.
  const std::string e2 = fresh_dir("ckpt_nosite_east"), w2 = fresh_dir("ckpt_nosite_west");
  ASSERT_EQ(run_two_sites(e2, w2, false, 5), "");
  EXPECT_FALSE(fs::exists(fs::path(crosstrain::checkpoint::final_checkpoint_dir(w2, 5)) / "manifest.json"));
}
