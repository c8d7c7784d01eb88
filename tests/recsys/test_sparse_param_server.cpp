// The sparse parameter server (issue 18, item 4) over ranks as threads: pulls return the rows one process would
// hold; pushes from several workers give the rows of the same updates applied in sequence to one whole table;
// mmap storage keeps the table out of the process's anonymous memory; the worker's row cache serves rows within
// max_age, evicts the least recently used, and the cached client pulls only what it misses; a vanished server
// or worker is an error naming it within the timeout, not a hang.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <unistd.h>

#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/recsys/sparse_param_server.h"
#include "scratch.h"

using namespace crosstrain;
using namespace crosstrain::recsys;
namespace fs = std::filesystem;

namespace {

constexpr uint64_t kSeed = 1234;

std::vector<TableShape> shapes(const std::vector<std::pair<int64_t, int64_t>>& rows_dims) {
  std::vector<TableShape> out;
  for (auto [rows, dim] : rows_dims) {
    TableShape s;
    s.rows = rows;
    s.dim = dim;
    out.push_back(s);
  }
  return out;
}

at::Tensor whole_table(int t, const TableShape& s) {
  at::Tensor w = at::empty({s.rows, s.dim}, at::kFloat);
  init_rows(w, kSeed, t, s.rows, 0, 0);
  return w;
}

at::Tensor ids_of(std::vector<int64_t> v) { return at::tensor(at::ArrayRef<int64_t>(v), at::kLong); }

// A deterministic gradient for worker `w` and table `t`: [n, dim].
at::Tensor gradient(int w, int t, int64_t n, int64_t dim) {
  return at::arange(n * dim, at::kFloat).add(7.0 * w + 3.0 * t).mul(0.37).sin().view({n, dim});
}

// Ids of table `t` that worker `w` pushes: overlapping between workers, spread over every row block.
at::Tensor push_ids(int w, int64_t rows) {
  std::vector<int64_t> v;
  for (int64_t r = w % 2; r < rows; r += 2 + w) v.push_back(r);
  v.push_back(rows - 1 - w % 2);
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return ids_of(v);
}

std::string temp_dir(const std::string& tag) { return crosstrain::testing::scratch_path("sparse-ps-" + tag).string(); }

int64_t rss_anon_kb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("RssAnon:", 0) == 0) return std::stoll(line.substr(8));
  return -1;
}

class PullAcrossWorlds : public ::testing::TestWithParam<int> {};

TEST_P(PullAcrossWorlds, ReturnsTheInitialRowsOfEveryServerInOneCall) {
  const int world = GetParam();
  // A table smaller than the world (empty blocks), an odd one, and one with rows % world != 0.
  const auto tables = shapes({{37, 4}, {3, 8}, {1001, 3}});
  std::vector<at::Tensor> whole;
  for (int t = 0; t < 3; ++t) whole.push_back(whole_table(t, tables[t]));
  comm::FakeWorld::run(world, [&](comm::Communicator& comm) {
    SparseParameterServer ps(comm, tables, SparseOptimizerConfig{}, TableStorage{}, kSeed, comm::Millis(10000));
    // Every row of table 0 (all servers in one pull), none of table 1, scattered and repeated rows of table 2.
    std::vector<at::Tensor> ids{at::arange(37, at::kLong).flip(0), ids_of({}),
                                ids_of({1000, 5, 500, 5, static_cast<int64_t>(comm.rank()), 333})};
    auto rows = ps.pull(ids);
    ASSERT_EQ(rows.size(), 3u);
    for (int t = 0; t < 3; ++t) {
      EXPECT_EQ(rows[t].size(0), ids[t].numel());
      EXPECT_EQ(rows[t].size(1), tables[t].dim);
      EXPECT_TRUE(at::equal(rows[t], whole[t].index_select(0, ids[t]))) << "table " << t << ", world " << world;
    }
    auto none = ps.pull({ids_of({}), ids_of({}), ids_of({})});
    EXPECT_EQ(none[1].sizes(), (std::vector<int64_t>{0, 8}));
    // The rank serves its row block: rows_total split with the first rows % world ranks one row more.
    const RowRange block = row_block(1001, comm.rank(), world);
    EXPECT_EQ(ps.shard(2).first_row(), block.first);
    EXPECT_EQ(ps.shard(2).rows(), block.last - block.first);
    EXPECT_TRUE(at::equal(ps.shard(2).weight(), whole[2].slice(0, block.first, block.last)));
    EXPECT_EQ(ps.bytes_sent() > 0, world > 1);
    ps.finish();
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, PullAcrossWorlds, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

struct PushCase {
  int world;
  std::string optimizer;
};
void PrintTo(const PushCase& c, std::ostream* os) { *os << c.optimizer << " on " << c.world << " ranks"; }

class PushInSequence : public ::testing::TestWithParam<PushCase> {};

// Worker w pushes once (clock 1 + w), after worker w - 1's push returned; the rows then equal one shard holding
// each whole table with the same updates applied in that order.
TEST_P(PushInSequence, EqualsTheUpdatesAppliedInOrderToOneWholeTable) {
  const int world = GetParam().world;
  SparseOptimizerConfig opt;
  opt.kind = GetParam().optimizer;
  opt.lr = 0.1;
  const auto tables = shapes({{10, 4}, {7, 3}});
  std::vector<std::unique_ptr<EmbeddingShard>> reference;
  for (int t = 0; t < 2; ++t)
    reference.push_back(std::make_unique<EmbeddingShard>(t, tables[t].rows, tables[t].dim, 0, tables[t].rows, 0,
                                                         tables[t].dim, opt, TableStorage{}, kSeed));
  for (int w = 0; w < world; ++w)
    for (int t = 0; t < 2; ++t) {
      const at::Tensor ids = push_ids(w, tables[t].rows);
      const at::Tensor g = gradient(w, t, ids.numel(), tables[t].dim);
      reference[t]->apply(ids, g, EmbeddingShard::row_square_sums(g), 1 + w);
    }
  comm::FakeWorld::run(world, [&](comm::Communicator& comm) {
    auto group = comm.split([&] {
      std::vector<int> all(world);
      std::iota(all.begin(), all.end(), 0);
      return all;
    }());
    SparseParameterServer ps(*group, tables, opt, TableStorage{}, kSeed, comm::Millis(10000));
    const int w = comm.rank();
    for (int turn = 0; turn < world; ++turn) {
      if (turn == w) {
        std::vector<at::Tensor> ids, grads;
        for (int t = 0; t < 2; ++t) {
          ids.push_back(push_ids(w, tables[t].rows));
          grads.push_back(gradient(w, t, ids.back().numel(), tables[t].dim));
        }
        const auto reply = ps.push(ids, grads, 1 + w);
        // The clocks every server acks: the workers after w have not pushed yet (clock 0).
        const bool last = w == world - 1;
        EXPECT_EQ(reply.min_clock, last ? 1 : 0);
        EXPECT_EQ(reply.slowest, last ? 0 : w + 1);
      }
      comm.barrier()->wait();
    }
    // Every push reached every server (a header alone where it held none of the rows).
    EXPECT_EQ(ps.pushes_applied(), world);
    EXPECT_EQ(ps.local_clocks().min_clock, 1);  // every worker pushed: the slowest is worker 0 at clock 1
    EXPECT_EQ(ps.local_clocks().slowest, 0);
    auto rows = ps.pull({at::arange(10, at::kLong), at::arange(7, at::kLong)});
    for (int t = 0; t < 2; ++t) {
      EXPECT_TRUE(at::allclose(rows[t], reference[t]->weight(), 0, 1e-7))
          << "table " << t << " on rank " << w << ":\n" << rows[t] << "\nexpected\n" << reference[t]->weight();
      EXPECT_FALSE(at::equal(rows[t], whole_table(t, tables[t])));  // the pushes did move rows
    }
    ps.finish();
  });
}

INSTANTIATE_TEST_SUITE_P(Optimizers, PushInSequence,
                         ::testing::Values(PushCase{1, "adagrad"}, PushCase{2, "adagrad"}, PushCase{3, "adagrad"},
                                           PushCase{2, "adam"}, PushCase{4, "adam"}),
                         [](const auto& info) {
                           return info.param.optimizer + "_" + std::to_string(info.param.world) + "ranks";
                         });

// Four workers read through their caches and push overlapping rows for 20 steps with no barrier between them:
// every push reaches every server and is applied once, nothing hangs, and every finish returns.
TEST(SparseParameterServer, ConcurrentWorkersWithoutBarriers) {
  const auto tables = shapes({{97, 8}, {5, 4}});
  constexpr int kSteps = 20;
  comm::FakeWorld::run(4, [&](comm::Communicator& comm) {
    SparseParameterServer ps(comm, tables, SparseOptimizerConfig{}, TableStorage{}, kSeed, comm::Millis(10000));
    CachedSparseClient client(ps, 32, 2);
    const int w = comm.rank();
    for (int step = 1; step <= kSteps; ++step) {
      std::vector<at::Tensor> ids{at::arange((step * 5 + w) % 3, 97, 3 + (step + w) % 4, at::kLong),
                                  at::arange(step % 2, 5, 2, at::kLong)};
      const auto rows = client.rows_for(ids, step);
      client.push(ids, {rows[0].mul(0.1), rows[1].mul(0.1)}, step);
    }
    EXPECT_GT(client.cache().hits(), 0);
    EXPECT_GT(client.rows_pulled(), 0);
    comm.barrier()->wait();
    EXPECT_EQ(ps.pushes_applied(), 4 * kSteps);
    EXPECT_EQ(ps.local_clocks().min_clock, kSteps);
    EXPECT_TRUE(ps.shard(0).weight().isfinite().all().item<bool>());
    ps.finish();
  });
}

TEST(SparseParameterServer, PushRejectsRepeatedIdsAndBadShapes) {
  comm::FakeWorld::run(1, [&](comm::Communicator& comm) {
    SparseParameterServer ps(comm, shapes({{10, 4}}), SparseOptimizerConfig{}, TableStorage{}, kSeed,
                             comm::Millis(1000));
    EXPECT_THROW(ps.push({ids_of({1, 1})}, {at::zeros({2, 4})}, 1), Error);
    EXPECT_THROW(ps.push({ids_of({1})}, {at::zeros({1, 3})}, 1), Error);
    EXPECT_THROW(ps.pull({ids_of({10})}), Error);
    EXPECT_THROW(ps.pull({ids_of({1}), ids_of({1})}), Error);
    ps.finish();
  });
}

TEST(SparseParameterServer, MmapStorageMatchesMemoryAndWritesFilesPerRank) {
  const std::string dir = temp_dir("small");
  const auto tables = shapes({{50, 4}, {9, 2}});
  comm::FakeWorld::run(2, [&](comm::Communicator& comm) {
    auto g1 = comm.split({0, 1});
    auto g2 = comm.split({0, 1});
    SparseParameterServer in_memory(*g1, tables, SparseOptimizerConfig{}, TableStorage{}, kSeed, comm::Millis(10000));
    SparseParameterServer mapped(*g2, tables, SparseOptimizerConfig{}, TableStorage{TableStorageKind::Mmap, dir}, kSeed,
                                 comm::Millis(10000));
    std::vector<at::Tensor> ids{push_ids(comm.rank(), 50), push_ids(comm.rank(), 9)};
    std::vector<at::Tensor> grads{gradient(comm.rank(), 0, ids[0].numel(), 4),
                                  gradient(comm.rank(), 1, ids[1].numel(), 2)};
    for (int turn = 0; turn < 2; ++turn) {  // same order of pushes on both servers
      if (turn == comm.rank()) {
        in_memory.push(ids, grads, 1);
        mapped.push(ids, grads, 1);
      }
      comm.barrier()->wait();
    }
    const std::vector<at::Tensor> all{at::arange(50, at::kLong), at::arange(9, at::kLong)};
    const auto a = in_memory.pull(all), b = mapped.pull(all);
    EXPECT_TRUE(at::equal(a[0], b[0]));
    EXPECT_TRUE(at::equal(a[1], b[1]));
    const fs::path mine = fs::path(dir) / ("rank" + std::to_string(comm.rank()));
    int weight_files = 0;
    for (const auto& e : fs::directory_iterator(mine))
      if (e.path().string().find("weight") != std::string::npos) {
        ++weight_files;
        EXPECT_GT(fs::file_size(e.path()), 0u);
      }
    EXPECT_EQ(weight_files, 2) << "one weight file per table under " << mine;
    const RowRange block = row_block(50, comm.rank(), 2);
    EXPECT_EQ(fs::file_size(mine / ("table0-rows" + std::to_string(block.first) + "-cols0.weight.f32")),
              static_cast<uintmax_t>((block.last - block.first) * 4 * sizeof(float)));
    in_memory.finish();
    mapped.finish();
  });
  fs::remove_all(dir);
}

// How much the process's anonymous memory grows while 2 ranks hold a table of `rows` x 16 (checking a few rows).
int64_t anonymous_growth_kb(int64_t rows, const TableStorage& storage) {
  const auto tables = shapes({{rows, 16}});
  const int64_t before = rss_anon_kb();
  EXPECT_GT(before, 0);
  std::mutex m;
  int64_t grown = 0;
  comm::FakeWorld::run(2, [&](comm::Communicator& comm) {
    SparseParameterServer ps(comm, tables, SparseOptimizerConfig{}, storage, kSeed, comm::Millis(30000));
    const at::Tensor ids = ids_of({0, 12345, rows / 2 + 7, rows - 1});
    auto got = ps.pull({ids});
    at::Tensor expect = at::empty({4, 16}, at::kFloat);
    for (int i = 0; i < 4; ++i) init_rows(expect.slice(0, i, i + 1), kSeed, 0, rows, ids[i].item<int64_t>(), 0);
    EXPECT_TRUE(at::equal(got[0], expect));
    EXPECT_EQ(ps.server_bytes(), rows / 2 * (16 + 1) * 4);  // weights and one adagrad sum per row
    comm.barrier()->wait();  // both ranks' blocks are built and filled
    {
      std::lock_guard<std::mutex> lock(m);
      grown = std::max(grown, rss_anon_kb() - before);
    }
    comm.barrier()->wait();
    ps.finish();
  });
  return grown;
}

TEST(SparseParameterServer, MmapTableStaysOutOfAnonymousMemory) {
  // 2^22 rows x 16 floats = 256 MiB of weights (plus 16 MiB of adagrad state) in files under the dir.
  const std::string dir = temp_dir("big");
  const int64_t table_kb = (int64_t{1} << 22) * 16 * 4 / 1024;
  const int64_t mapped = anonymous_growth_kb(int64_t{1} << 22, TableStorage{TableStorageKind::Mmap, dir});
  EXPECT_TRUE(fs::exists(fs::path(dir) / "rank0") && fs::exists(fs::path(dir) / "rank1"));
  // Control (after, so it frees nothing the mmap run could reuse): a 64 MiB table in memory shows in RssAnon.
  const int64_t small_kb = (int64_t{1} << 20) * 16 * 4 / 1024;
  const int64_t in_memory = anonymous_growth_kb(int64_t{1} << 20, TableStorage{});
  EXPECT_GT(in_memory, small_kb * 9 / 10) << "a table in memory should grow anonymous memory";
  fs::remove_all(dir);
  std::printf("anonymous memory grew by %lld kB for a %lld kB table in memory, by %lld kB for a %lld kB mmap table\n",
              static_cast<long long>(in_memory), static_cast<long long>(small_kb), static_cast<long long>(mapped),
              static_cast<long long>(table_kb));
  EXPECT_LT(mapped, table_kb / 8);
}

TEST(RowCache, HitsWithinMaxAgeMissesAfter) {
  RowCache cache({4}, 8, 2);
  const at::Tensor rows = at::arange(8, at::kFloat).view({2, 4});
  cache.insert(0, ids_of({5, 9}), rows, 10);
  auto at12 = cache.lookup(0, ids_of({9, 5, 7}), 12);
  EXPECT_TRUE(at::equal(at12.hit_pos, ids_of({0, 1})));
  EXPECT_TRUE(at::equal(at12.hit_rows, rows.flip(0)));
  EXPECT_TRUE(at::equal(at12.miss_ids, ids_of({7})));
  EXPECT_TRUE(at::equal(at12.miss_pos, ids_of({2})));
  auto at13 = cache.lookup(0, ids_of({5, 9}), 13);  // fetched at 10: 3 steps old > max_age 2
  EXPECT_EQ(at13.hit_pos.numel(), 0);
  EXPECT_TRUE(at::equal(at13.miss_ids, ids_of({5, 9})));
  EXPECT_EQ(cache.hits(), 2);
  EXPECT_EQ(cache.misses(), 3);
  EXPECT_EQ(cache.stale(), 2);
  cache.insert(0, ids_of({5}), rows.slice(0, 1).add(100), 13);  // a refreshed copy replaces the old one
  auto again = cache.lookup(0, ids_of({5}), 15);
  EXPECT_TRUE(at::equal(again.hit_rows, rows.slice(0, 1).add(100)));
  EXPECT_EQ(cache.size(), 2);
}

TEST(RowCache, EvictsTheLeastRecentlyUsedAcrossTables) {
  RowCache cache({4, 2}, 3, 100);
  cache.insert(0, ids_of({1, 2}), at::ones({2, 4}), 0);
  cache.insert(1, ids_of({1}), at::full({1, 2}, 3.0f), 0);
  cache.lookup(0, ids_of({1}), 1);                            // 1 of table 0 is now the newest; 2 the oldest
  cache.insert(0, ids_of({3}), at::zeros({1, 4}), 1);         // full: evicts row 2 of table 0
  EXPECT_EQ(cache.evictions(), 1);
  EXPECT_EQ(cache.size(), 3);
  auto t0 = cache.lookup(0, ids_of({1, 2, 3}), 2);
  EXPECT_TRUE(at::equal(t0.miss_ids, ids_of({2})));
  auto t1 = cache.lookup(1, ids_of({1}), 2);
  EXPECT_TRUE(at::equal(t1.hit_rows, at::full({1, 2}, 3.0f)));  // the narrow table's row kept its own width
  // More rows than capacity in one insert: the last `capacity` stay.
  cache.insert(1, ids_of({10, 11, 12, 13}), at::arange(8, at::kFloat).view({4, 2}), 3);
  auto last = cache.lookup(1, ids_of({10, 11, 12, 13}), 3);
  EXPECT_TRUE(at::equal(last.hit_pos, ids_of({1, 2, 3})));
  EXPECT_TRUE(at::equal(last.hit_rows, at::arange(2, 8, at::kFloat).view({3, 2})));
  cache.invalidate(1, ids_of({12}));
  EXPECT_EQ(cache.size(), 2);
  EXPECT_EQ(cache.lookup(1, ids_of({12}), 3).miss_ids.numel(), 1);
}

TEST(RowCache, ZeroCapacityCachesNothing) {
  RowCache cache({4}, 0, 5);
  cache.insert(0, ids_of({1}), at::ones({1, 4}), 0);
  EXPECT_EQ(cache.lookup(0, ids_of({1}), 0).miss_ids.numel(), 1);
  EXPECT_EQ(cache.hits(), 0);
}

// A worker reads rows through its cache: within max_age it sees the rows it fetched (not the pushes since), after
// max_age it pulls again and sees the server's rows; only misses are pulled.
TEST(CachedSparseClient, PullsOnlyMissesAndRefreshesAfterMaxAge) {
  const auto tables = shapes({{40, 4}, {6, 2}});
  comm::FakeWorld::run(2, [&](comm::Communicator& comm) {
    SparseParameterServer ps(comm, tables, SparseOptimizerConfig{}, TableStorage{}, kSeed, comm::Millis(10000));
    CachedSparseClient client(ps, 100, 1);
    const std::vector<at::Tensor> ids{ids_of({39, 0, 20}), ids_of({5})};
    const auto step1 = client.rows_for(ids, 1);
    EXPECT_EQ(client.rows_pulled(), 4);
    EXPECT_TRUE(at::equal(step1[0], whole_table(0, tables[0]).index_select(0, ids[0])));
    comm.barrier()->wait();  // both workers read the initial rows
    ps.push(ids, {at::ones({3, 4}), at::ones({1, 2})}, 1);
    comm.barrier()->wait();  // both workers' pushes applied
    const auto step2 = client.rows_for({ids_of({0, 21}), ids_of({5})}, 2);  // 0 and 5 cached at step 1
    EXPECT_EQ(client.rows_pulled(), 5);
    EXPECT_TRUE(at::equal(step2[0][0], step1[0][1]));  // stale by one step: the cached row
    const auto now = ps.pull(ids);
    EXPECT_FALSE(at::equal(now[0], step1[0]));
    const auto step3 = client.rows_for(ids, 3);  // fetched at 1: too old at 3, pulled again
    EXPECT_EQ(client.rows_pulled(), 9);
    EXPECT_TRUE(at::equal(step3[0], now[0]));
    EXPECT_TRUE(at::equal(step3[1], now[1]));
    EXPECT_EQ(client.cache().hits(), 2);
    comm.barrier()->wait();
    ps.finish();
  });
}

bool mentions(const std::string& what, std::initializer_list<const char*> parts) {
  for (const char* p : parts)
    if (what.find(p) == std::string::npos) return false;
  return true;
}

// Rank 1 never serves: rank 0's pull or push of a row of rank 1 fails after the timeout (500 ms), before its own
// server gives up waiting for worker 1 (2 x timeout), with an error naming the operation, table and server.
class AbsentServer : public ::testing::TestWithParam<std::string> {};

TEST_P(AbsentServer, IsAnErrorNamingItWithinTheTimeout) {
  const std::string op = GetParam();
  std::string message;
  double seconds = 0;
  comm::FakeWorld::run(2, [&](comm::Communicator& comm) {
    if (comm.rank() == 1) return;
    SparseParameterServer ps(comm, shapes({{10, 4}, {3, 2}}), SparseOptimizerConfig{}, TableStorage{}, kSeed,
                             comm::Millis(500));
    const auto start = std::chrono::steady_clock::now();
    try {
      if (op == "pull")
        ps.pull({ids_of({1, 9}), ids_of({})});  // row 9 lives on rank 1
      else
        ps.push({ids_of({1, 9}), ids_of({})}, {at::ones({2, 4}), at::ones({0, 2})}, 1);
    } catch (const CommError& e) {
      message = e.what();
      EXPECT_TRUE(e.timed_out());
    }
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  EXPECT_TRUE(mentions(message, {"rank 0", op.c_str(), "of table 0 from server 1", "peer 1"})) << message;
  EXPECT_LT(seconds, 3.0);
}

INSTANTIATE_TEST_SUITE_P(Ops, AbsentServer, ::testing::Values("pull", "push"),
                         [](const auto& info) { return info.param; });

TEST(SparseParameterServerFailure, ServerThreadFailureIsRethrownByTheWorkerNamingThePeer) {
  std::string message;
  comm::FakeWorld::run(2, [&](comm::Communicator& comm) {
    SparseParameterServer ps(comm, shapes({{10, 4}}), SparseOptimizerConfig{}, TableStorage{}, kSeed,
                             comm::Millis(300));
    // Nobody sends a request for longer than 2 x timeout: each server thread gives up on its worker.
    std::this_thread::sleep_for(std::chrono::milliseconds(1200));
    if (comm.rank() != 0) return;
    try {
      ps.pull({ids_of({0})});  // a row of its own: no communication, the server's failure comes first
    } catch (const Error& e) {
      message = e.what();
    }
  });
  EXPECT_TRUE(mentions(message, {"sparse parameter server of rank 0", "serving worker 1", "peer 1"})) << message;
}

// Figures: one pull and one push of 4096 rows x dim 16 (spread over both servers) on 2 ranks.
TEST(SparseParameterServerFigures, PullPushRoundTrip4096x16On2Ranks) {
  const auto tables = shapes({{1 << 20, 16}});
  comm::FakeWorld::run(2, [&](comm::Communicator& comm) {
    SparseParameterServer ps(comm, tables, SparseOptimizerConfig{}, TableStorage{}, kSeed, comm::Millis(10000));
    const at::Tensor ids = at::arange(0, 1 << 20, 256, at::kLong).add(comm.rank());  // 4096 ids, half remote
    const at::Tensor grads = at::full({4096, 16}, 0.01f);
    constexpr int kRounds = 20;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kRounds; ++i) ps.pull({ids});
    const auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < kRounds; ++i) ps.push({ids}, {grads}, i + 1);
    const auto t2 = std::chrono::steady_clock::now();
    const double pull_ms = std::chrono::duration<double, std::milli>(t1 - t0).count() / kRounds;
    const double push_ms = std::chrono::duration<double, std::milli>(t2 - t1).count() / kRounds;
    comm.barrier()->wait();
    if (comm.rank() == 0)
      std::printf("sparse_ps rows=4096 dim=16 ranks=2 pull_ms=%.3f push_ms=%.3f bytes_sent=%lld\n", pull_ms, push_ms,
                  static_cast<long long>(ps.bytes_sent()));
    EXPECT_GT(ps.bytes_sent(), kRounds * 2048 * 16 * 4);  // at least the remote half of the gradients
    ps.finish();
  });
}

}  // namespace
