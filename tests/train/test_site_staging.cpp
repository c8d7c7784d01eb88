// Checkpoints between sites that share no file system (train/site_stager.h): four ranks as threads, east holding
// two of them, west and north one each, every site with a run folder of its own.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <filesystem>
#include <atomic>
#include <future>
#include <thread>
#include <fstream>
#include <mutex>

#include "crosstrain/checkpoint/distributed.h"
#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/comm/init.h"
#include "crosstrain/comm/rendezvous.h"
#include "crosstrain/core/error.h"
#include "crosstrain/core/fence.h"
#include "crosstrain/train/checkpoint.h"
#include "crosstrain/train/checkpoint_sites.h"
#include "../support/scratch.h"

using namespace crosstrain;
namespace fs = std::filesystem;

namespace {

const std::vector<std::string> kSiteOf = {"east", "east", "west", "north"};
constexpr int64_t kElements = 4096;  // per rank: 16 KiB, 16 chunks of 1 KiB

struct Sites {
  std::map<std::string, std::string> dir;
  explicit Sites(const std::string& tag) {
    for (const std::string& s : {"east", "west", "north"}) dir[s] = crosstrain::testing::scratch_dir(tag + "_" + s).string();
  }
  const std::string& of(int rank) const { return dir.at(kSiteOf[rank]); }
};

// Rank r's part of a 4-rank model: one tensor, each rank an even share, values that name the step and rank.
std::vector<checkpoint::Piece> pieces(int rank, int64_t step) {
  checkpoint::Piece p;
  p.tensor = p.param = "w";
  p.global_shape = p.shard_shape = {4 * kElements};
  p.offset = rank * kElements;
  p.data = at::arange(kElements, at::kFloat) + static_cast<float>(step * 100 + rank);
  return {p};
}

std::unique_ptr<train::CheckpointWriter> writer(comm::Communicator& c, const Sites& sites,
                                                 checkpoint::StorageFaults faults = {}, const std::string& fence = "") {
  auto w = std::make_unique<train::CheckpointWriter>(c, sites.of(c.rank()), 0, false, 30.0, faults, fence,
                                                     kSiteOf[c.rank()]);
  w->set_stage_chunk_bytes(1024);
  return w;
}

void save(train::CheckpointWriter& w, int rank, int64_t step) {
  w.save(step, pieces(rank, step), {{"step", step}});
  w.commit();
}

bool whole_at(const std::string& dir, int64_t step) {
  const std::string ckpt = checkpoint::final_checkpoint_dir(dir, step);
  if (!fs::exists(fs::path(ckpt) / "manifest.json")) return false;
  checkpoint::CheckpointReader reader(ckpt);
  reader.verify(true);  // every file's size and every tensor's checksum
  return true;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// The save returns before any file has crossed: a second checkpoint is saved while the stagers are held; once let
// go, and drained at the end, every site holds both checkpoints whole, each file the same bytes at every site.
TEST(SiteStaging, TrainingGoesOnWhileTheFilesCrossAndEverySiteEndsWithTheWholeCheckpoint) {
  const Sites sites("staging_background");
  checkpoint::StorageFaults faults;
  faults.stage_hold_file = crosstrain::testing::scratch_path("staging_background_go").string();
  std::vector<train::StagingStats> stats(4);
  std::mutex mu;
  comm::FakeWorld::run(4, [&](comm::Communicator& c) {
    auto w = writer(c, sites, faults);
    save(*w, c.rank(), 5);
    save(*w, c.rank(), 10);
    c.barrier()->wait();
    if (c.rank() == 0) {
      // Nothing moved yet: no site has either checkpoint whole, and each holds only its own ranks' files.
      for (const auto& [name, dir] : sites.dir) {
        EXPECT_FALSE(fs::exists(checkpoint::final_checkpoint_dir(dir, 5))) << name;
        EXPECT_FALSE(fs::exists(checkpoint::final_checkpoint_dir(dir, 10))) << name;
      }
      const fs::path west5 = train::staging_dir(sites.dir.at("west"), 5);
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);  // west's stager renames it
      while (!fs::exists(west5 / "rank-00002.safetensors") && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      EXPECT_TRUE(fs::exists(west5 / "rank-00002.safetensors"));
      EXPECT_FALSE(fs::exists(west5 / "rank-00000.safetensors"));
      std::ofstream(faults.stage_hold_file) << "go\n";
    }
    w->drain();
    std::lock_guard<std::mutex> lock(mu);
    stats[c.rank()] = w->staging_stats();
  });
  for (const auto& [name, dir] : sites.dir)
    for (int64_t step : {5, 10}) EXPECT_TRUE(whole_at(dir, step)) << name << " step " << step;
  for (int rank = 0; rank < 4; ++rank) {
    const auto file = [&](const std::string& site) {
      return train::file_checksum(
          (fs::path(checkpoint::final_checkpoint_dir(sites.dir.at(site), 10)) / checkpoint::piece_file_name(rank))
              .string());
    };
    EXPECT_EQ(file("west"), file("east")) << rank;
    EXPECT_EQ(file("north"), file("east")) << rank;
  }
  // East gets west's and north's files of each step, west and north the three others'.
  const auto bytes_of = [&](std::vector<int> ranks) {
    int64_t total = 0;
    for (int64_t step : {5, 10})
      for (int r : ranks)
        total += fs::file_size(fs::path(checkpoint::final_checkpoint_dir(sites.dir.at("east"), step)) /
                               checkpoint::piece_file_name(r));
    return total;
  };
  EXPECT_EQ(stats[0].bytes_received, bytes_of({2, 3}));
  EXPECT_EQ(stats[2].bytes_received, bytes_of({0, 1, 3}));
  EXPECT_EQ(stats[3].bytes_received, bytes_of({0, 1, 2}));
  EXPECT_EQ(stats[0].steps_committed, 2);
}

// The link is cut two chunks into the first file: the run's drain says the checkpoint did not reach every site,
// and the part that arrived stays. The next placement's stager continues that file from its last byte (2 KiB not
// sent again) and completes the checkpoint at every site, beside the new one.
TEST(SiteStaging, AFileCutOffMidwayIsResumedFromItsLastByteByTheNextPlacement) {
  const Sites sites("staging_resume");
  checkpoint::StorageFaults cut;
  cut.stage_cut_chunks = 2;
  comm::FakeWorld::run(4, [&](comm::Communicator& c) {
    auto w = writer(c, sites, cut);
    save(*w, c.rank(), 5);
    const std::string error = error_of([&] { w->drain(); });
    EXPECT_NE(error.find("did not reach every site"), std::string::npos) << error;
  }, comm::Millis(10000));
  // East's first transfer is west's file: 2 KiB of it arrived.
  const fs::path part = fs::path(train::staging_dir(sites.dir.at("east"), 5)) / "rank-00002.safetensors.part";
  ASSERT_TRUE(fs::exists(part));
  EXPECT_EQ(fs::file_size(part), 2048u);
  EXPECT_FALSE(fs::exists(checkpoint::final_checkpoint_dir(sites.dir.at("east"), 5)));

  std::vector<train::StagingStats> stats(4);
  std::mutex mu;
  comm::FakeWorld::run(4, [&](comm::Communicator& c) {
    auto w = writer(c, sites);
    save(*w, c.rank(), 6);
    w->drain();
    std::lock_guard<std::mutex> lock(mu);
    stats[c.rank()] = w->staging_stats();
  });
  EXPECT_EQ(stats[0].bytes_resumed, 2048);
  for (const auto& [name, dir] : sites.dir)
    for (int64_t step : {5, 6}) EXPECT_TRUE(whole_at(dir, step)) << name << " step " << step;
}

// A site whose run folder a newer placement has fenced off (its FENCE names another token) never commits the
// staged checkpoint; the others do, and the end of the run says the checkpoint did not reach every site.
TEST(SiteStaging, AFencedSiteNeverCommitsWhatArrives) {
  const Sites sites("staging_fence");
  for (const auto& [name, dir] : sites.dir) write_fence(dir, name == "west" ? "placement-2" : "placement-1");
  comm::FakeWorld::run(4, [&](comm::Communicator& c) {
    auto w = writer(c, sites, {}, "placement-1");
    save(*w, c.rank(), 5);
    const std::string error = error_of([&] { w->drain(); });
    EXPECT_NE(error.find(c.rank() == 1 ? "did not reach every site" : "site 1 does not hold the checkpoint of step 5"),
              std::string::npos)
        << error;
  });
  EXPECT_TRUE(whole_at(sites.dir.at("east"), 5));
  EXPECT_TRUE(whole_at(sites.dir.at("north"), 5));
  EXPECT_FALSE(fs::exists(checkpoint::final_checkpoint_dir(sites.dir.at("west"), 5)));
}

// Over Gloo with a 3 s group timeout, the stagers are held 8 s: the ranks wait for them at the end of the run in short
// rounds (a single collective would time out after 3 s) and end with the checkpoint whole at every site.
TEST(SiteStaging, TheEndOfARunWaitsLongerThanTheGroupsTimeoutForTheStagers) {
  const Sites sites("staging_long_drain");
  checkpoint::StorageFaults faults;
  faults.stage_hold_file = crosstrain::testing::scratch_path("staging_long_drain_go").string();
  const comm::Millis timeout(3000);
  auto host = comm::Rendezvous::host("127.0.0.1", 0, 4, comm::Millis(10000), 0);
  std::vector<std::future<std::string>> ranks;
  for (int rank = 0; rank < 4; ++rank)
    ranks.push_back(std::async(std::launch::async, [&, rank] {
      return error_of([&] {
        auto rendezvous =
            rank == 0 ? host : comm::Rendezvous::connect("127.0.0.1", host->port(), rank, 4, comm::Millis(10000));
        auto c = comm::make_gloo_communicator(rendezvous, rank, 4, timeout);
        auto w = writer(*c, sites, faults);
        save(*w, rank, 5);
        w->drain();
      });
    }));
  std::this_thread::sleep_for(std::chrono::seconds(8));
  std::ofstream(faults.stage_hold_file) << "go\n";
  for (int rank = 0; rank < 4; ++rank) EXPECT_EQ(ranks[rank].get(), "") << "rank " << rank;
  for (const auto& [name, dir] : sites.dir) EXPECT_TRUE(whole_at(dir, 5)) << name;
}

// A copy half staged by an earlier placement of the job (another fence token) is never completed by the next one:
// each site drops it, and only the new placement's checkpoint is committed.
TEST(SiteStaging, AnotherPlacementsHalfStagedCopyIsDroppedNotCompleted) {
  const Sites sites("staging_other_placement");
  for (const auto& [name, dir] : sites.dir) write_fence(dir, "job-1.a1");
  checkpoint::StorageFaults cut;
  cut.stage_cut_chunks = 2;
  comm::FakeWorld::run(4, [&](comm::Communicator& c) {
    auto w = writer(c, sites, cut, "job-1.a1");
    save(*w, c.rank(), 5);
    EXPECT_NE(error_of([&] { w->drain(); }), "");
  }, comm::Millis(10000));
  ASSERT_TRUE(fs::exists(train::staging_dir(sites.dir.at("east"), 5)));
  for (const auto& [name, dir] : sites.dir) write_fence(dir, "job-1.a2");  // the job was placed again
  comm::FakeWorld::run(4, [&](comm::Communicator& c) {
    auto w = writer(c, sites, {}, "job-1.a2");
    save(*w, c.rank(), 6);
    w->drain();
  });
  for (const auto& [name, dir] : sites.dir) {
    EXPECT_FALSE(fs::exists(train::staging_dir(dir, 5))) << name;
    EXPECT_FALSE(fs::exists(checkpoint::final_checkpoint_dir(dir, 5))) << name;
    EXPECT_TRUE(whole_at(dir, 6)) << name;
  }
}

// A stager waiting on a silent peer (here: west's stager held before it sends anything, over Gloo with a 30 s
// timeout) is stopped at once when its writer goes, as when a generation ends: nobody waits out the timeout.
TEST(SiteStaging, AStagerWaitingOnASilentPeerStopsAtOnce) {
  const Sites sites("staging_silent_peer");
  const std::string never = crosstrain::testing::scratch_path("staging_silent_never").string();
  auto host = comm::Rendezvous::host("127.0.0.1", 0, 4, comm::Millis(10000), 0);
  std::promise<void> others_gone;
  std::shared_future<void> gone = others_gone.get_future().share();
  std::atomic<int> left{3};
  std::vector<std::future<double>> ranks;
  for (int rank = 0; rank < 4; ++rank)
    ranks.push_back(std::async(std::launch::async, [&, rank] {
      auto rendezvous =
          rank == 0 ? host : comm::Rendezvous::connect("127.0.0.1", host->port(), rank, 4, comm::Millis(10000));
      auto c = comm::make_gloo_communicator(rendezvous, rank, 4, comm::Millis(30000));
      checkpoint::StorageFaults faults;
      if (rank == 2) faults.stage_hold_file = never;  // west's stager never moves a byte while the others wait
      auto w = writer(*c, sites, faults);
      save(*w, rank, 5);
      std::this_thread::sleep_for(std::chrono::seconds(2));  // east and north wait for west's file
      if (rank == 2) {
        gone.wait();  // west stays silent until the others' writers are gone
        return 0.0;
      }
      const auto t0 = std::chrono::steady_clock::now();
      w.reset();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (--left == 0) others_gone.set_value();
      return s;
    }));
  for (int rank = 0; rank < 4; ++rank) EXPECT_LT(ranks[rank].get(), 5.0) << "rank " << rank << "'s writer waited";
}
