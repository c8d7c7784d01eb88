// The one training loop (train/loop.h) over a scripted job: when it evaluates, saves and writes rows, how the
// stop vote ends every rank at the same step, and how a driver's hooks end a run early.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/train/loop.h"

namespace fs = std::filesystem;
using namespace crosstrain;

namespace {

// Records what the loop asked of it, in order ("train 3", "eval 4", "save 4", "row 4").
class ScriptedJob : public train::Job {
 public:
  explicit ScriptedJob(bool evaluates_last = false, train::StopCheck stop_check = {})
      : evaluates_last_(evaluates_last), stop_check_(stop_check) {}
  int64_t start_step() const override { return 1; }
  void set_step(int64_t step) override { step_ = step; }
  train::StopCheck stop_check() const override { return stop_check_; }
  void ask_to_stop() override { calls.push_back("asked " + std::to_string(step_)); }
  bool stop_heard() const override { return hears_from >= 0 && step_ >= hears_from; }
  void print_header() const override {}
  train::StepRecord train_step(int64_t step, const std::function<void()>& before_commit) override {
    if (before_commit) before_commit();
    calls.push_back("train " + std::to_string(step));
    train::StepRecord r;
    r.step = step;
    r.loss = 1.0 / static_cast<double>(step);
    return r;
  }
  bool has_validation() const override { return true; }
  bool evaluates_last_step() const override { return evaluates_last_; }
  train::Evaluation evaluate() override {
    calls.push_back("eval " + std::to_string(step_));
    if (evaluates_with) {  // as a real evaluation does: the ranks meet in it
      at::Tensor loss = at::full({1}, 1.0f);
      evaluates_with->all_reduce(loss, comm::ReduceOp::Sum)->wait();
    }
    train::Evaluation e;
    e.loss = 0.5;
    return e;
  }
  std::string checkpoint(int64_t step) override {
    calls.push_back("save " + std::to_string(step));
    return "";
  }
  std::string commit_pending() override { return ""; }
  std::string save_now(int64_t step) override {
    calls.push_back("save now " + std::to_string(step));
    return "";
  }
  void add_metrics(obs::StepMetrics& m, const train::StepRecord& rec, double) override {
    calls.push_back("row " + std::to_string(rec.step));
    m.counts["scripted"] = 1;
  }
  void flush_trace() override {}
  void finish() override { calls.push_back("finish"); }
  train::LiveState live_state(int64_t) override { return {}; }

  std::vector<std::string> calls;
  int64_t hears_from = -1;  // stop_check().every = 0: the step from which a push's reply carries a stop
  comm::Communicator* evaluates_with = nullptr;  // evaluate() is collective over it

 private:
  bool evaluates_last_;
  train::StopCheck stop_check_;
  int64_t step_ = 0;
};

train::Config config(const std::string& name, int64_t steps, int64_t eval_every) {
  train::Config c;
  c.run.dir = (fs::path(::testing::TempDir()) / ("loop-" + name)).string();
  fs::remove_all(c.run.dir);
  c.train.steps = steps;
  c.train.eval_every = eval_every;
  c.train.sample_tokens = 0;
  return c;
}

int rows(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "metrics.jsonl");
  std::string line;
  int n = 0;
  while (std::getline(in, line)) ++n;
  return n;
}

}  // namespace

TEST(TrainLoop, EvaluatesSavesAndWritesRowsOnScheduleWithRowsOnRankZeroOnly) {
  const train::Config c = config("schedule", 10, 4);
  std::vector<std::vector<std::string>> calls(2);
  comm::FakeWorld::run(2, [&](comm::Communicator& world) {
    train::TrainOptions o;
    o.quiet = true;
    ScriptedJob job;
    train::TrainLoop loop(c, o);
    if (world.rank() == 0) loop.open_outputs(0);
    EXPECT_EQ(loop.run(job, world, 1), train::LoopEnd::Finished);
    loop.finish(job, world.rank() == 0);
    EXPECT_EQ(loop.result().steps.size(), 10u);
    EXPECT_DOUBLE_EQ(loop.result().val_loss, 0.5);
    calls[world.rank()] = job.calls;
  });
  const std::vector<std::string> first = {"train 1", "save 1", "row 1", "train 2", "save 2", "row 2",
                                          "train 3", "save 3", "row 3", "train 4", "eval 4", "save 4", "row 4"};
  ASSERT_GE(calls[0].size(), first.size());
  EXPECT_EQ(std::vector<std::string>(calls[0].begin(), calls[0].begin() + first.size()), first);
  const std::vector<std::string> last = {"train 10", "eval 10", "save 10", "row 10", "finish"};
  EXPECT_EQ(std::vector<std::string>(calls[0].end() - last.size(), calls[0].end()), last);
  // Rank 1 evaluates and saves too (collectives), but writes no row.
  EXPECT_EQ(std::count(calls[1].begin(), calls[1].end(), "eval 8"), 1);
  EXPECT_EQ(std::count_if(calls[1].begin(), calls[1].end(), [](const std::string& s) { return s.rfind("row", 0) == 0; }), 0);
  EXPECT_EQ(rows(c.run.dir), 10);
  // The loop fills the common fields of every row; the job adds its own.
  std::ifstream in(fs::path(c.run.dir) / "metrics.jsonl");
  std::string row;
  std::getline(in, row);
  for (const char* field : {"\"step\":1", "\"loss\"", "\"lr\"", "\"tokens_per_s\"", "\"step_time_s\"",
                            "\"time_s\"", "\"checkpoint_s\"", "\"peak_rss_bytes\"", "\"scripted\":1"})
    EXPECT_NE(row.find(field), std::string::npos) << field << " missing from " << row;
  EXPECT_TRUE(fs::exists(fs::path(c.run.dir) / "config.toml"));
}

TEST(TrainLoop, AFamilyThatReportsItsFinalFiguresEvaluatesTheLastStepWithoutEvalEvery) {
  const train::Config c = config("last", 3, 0);
  comm::FakeWorld::run(1, [&](comm::Communicator& world) {
    train::TrainOptions o;
    o.quiet = true;
    ScriptedJob plain, final_figures(/*evaluates_last=*/true);
    train::TrainLoop a(c, o), b(c, o);
    a.run(plain, world, 1);
    b.run(final_figures, world, 1);
    EXPECT_EQ(std::count(plain.calls.begin(), plain.calls.end(), "eval 3"), 0);
    EXPECT_EQ(std::count(final_figures.calls.begin(), final_figures.calls.end(), "eval 3"), 1);
  });
}

TEST(TrainLoop, AStopAskedOnOneRankEndsEveryRankAfterTheSameStep) {
  const train::Config c = config("stop", 1000, 0);
  std::vector<int64_t> stopped(3, -2);
  comm::FakeWorld::run(3, [&](comm::Communicator& world) {
    train::TrainOptions o;
    o.quiet = true;
    ScriptedJob job;
    int polls = 0;
    // Rank 2 asks at its fifth step; the others never do.
    o.stop_requested = [&] { return world.rank() == 2 && ++polls >= 5; };
    train::TrainLoop loop(c, o);
    EXPECT_EQ(loop.run(job, world, 1), train::LoopEnd::Stopped);
    stopped[world.rank()] = loop.result().stopped_after;
  });
  EXPECT_EQ(stopped[0], 5);  // the vote posted at step 5 is read before step 6
  EXPECT_EQ(stopped[1], 5);
  EXPECT_EQ(stopped[2], 5);
}

TEST(TrainLoop, RanksThatHearEveryFewStepsVoteOnlyThereAndReadTheVoteTheLagLater) {
  const train::Config c = config("stop-outer", 1000, 0);
  struct Case {
    train::StopCheck check;
    int64_t stopped;  // the step every rank stops after
  };
  // DiLoCo with 4 inner steps: posted before steps 4 and 8, read a step later. ssp with staleness 2: posted
  // before steps 3 and 6, read before steps 6 and 9.
  for (const Case k : {Case{{4, 1}, 8}, Case{{3, 3}, 8}}) {
    std::vector<int64_t> stopped(2, -2);
    std::vector<int> polls(2, 0);
    comm::FakeWorld::run(2, [&](comm::Communicator& world) {
      train::TrainOptions o;
      o.quiet = true;
      ScriptedJob job(false, k.check);
      int& mine = polls[world.rank()];
      // Rank 1 asks from its second poll on.
      o.stop_requested = [&] { return world.rank() == 1 && ++mine >= 2; };
      train::TrainLoop loop(c, o);
      EXPECT_EQ(loop.run(job, world, 1), train::LoopEnd::Stopped);
      stopped[world.rank()] = loop.result().stopped_after;
      // The last step run is the one before the read, on every rank.
      const auto trained = std::find_if(job.calls.rbegin(), job.calls.rend(),
                                        [](const std::string& call) { return call.rfind("train ", 0) == 0; });
      ASSERT_NE(trained, job.calls.rend());
      EXPECT_EQ(*trained, "train " + std::to_string(k.stopped));
    });
    EXPECT_EQ(polls[1], 2) << "every " << k.check.every;
    EXPECT_EQ(stopped, (std::vector<int64_t>{k.stopped, k.stopped})) << "every " << k.check.every;
  }
}

// async: no vote. Rank 1 is asked before its step 3 and hears of it there; rank 0 hears before step 7 (its pushes
// came later). Each says the last step it did (2 and 6): both train on to step 6 and stop after it.
TEST(TrainLoop, RanksWithoutAVoteStopAfterTheFurthestStepAnyOfThemDidWhenTheyHeard) {
  const train::Config c = config("stop-heard", 1000, 0);
  std::vector<int64_t> stopped(2, -2);
  std::vector<std::vector<std::string>> calls(2);
  comm::FakeWorld::run(2, [&](comm::Communicator& world) {
    train::TrainOptions o;
    o.quiet = true;
    ScriptedJob job(false, {0, 0});
    job.hears_from = world.rank() == 1 ? 3 : 7;
    int polls = 0;
    o.stop_requested = [&] { return world.rank() == 1 && ++polls >= 3; };
    train::TrainLoop loop(c, o);
    EXPECT_EQ(loop.run(job, world, 1), train::LoopEnd::Stopped);
    stopped[world.rank()] = loop.result().stopped_after;
    calls[world.rank()] = job.calls;
  });
  EXPECT_EQ(stopped, (std::vector<int64_t>{6, 6}));
  EXPECT_EQ(std::count(calls[1].begin(), calls[1].end(), "asked 3"), 1);  // told the servers once
  EXPECT_EQ(std::count(calls[0].begin(), calls[0].end(), "train 6"), 1);
  EXPECT_EQ(std::count(calls[0].begin(), calls[0].end(), "train 7"), 0);
}

// Two async ranks (no vote) whose evaluations are collective: rank 0 is asked to stop when `asked`; rank R's
// pushes carry the stop from step hears_from[R]. Returns each rank's stopped_after and calls.
struct AsyncRun {
  std::vector<int64_t> stopped = std::vector<int64_t>(2, -2);
  std::vector<std::vector<std::string>> calls = std::vector<std::vector<std::string>>(2);
  std::vector<train::LoopEnd> ends = std::vector<train::LoopEnd>(2, train::LoopEnd::Finished);
};

AsyncRun run_async_with_evaluations(const train::Config& c, bool asked, std::vector<int64_t> hears_from) {
  AsyncRun out;
  comm::FakeWorld::run(
      2,
      [&](comm::Communicator& world) {
        train::TrainOptions o;
        o.quiet = true;
        ScriptedJob job(false, {0, 0});
        job.evaluates_with = &world;
        job.hears_from = hears_from[world.rank()];
        o.stop_requested = [&] { return asked && world.rank() == 0; };
        train::TrainLoop loop(c, o);
        out.ends[world.rank()] = loop.run(job, world, 1);
        out.stopped[world.rank()] = loop.result().stopped_after;
        out.calls[world.rank()] = job.calls;
      },
      comm::Millis(5000));
  return out;
}

// async with a collective evaluation every 10 steps: rank 0 hears before step 8, rank 1 not until step 12. Rank 1
// must not go into the evaluation after step 10 while rank 0 waits in the exchange (each would wait for the other
// until the group timeout): it joins the exchange before step 10 instead, and both stop after step 9.
TEST(TrainLoop, ARankThatHasNotHeardJoinsTheStopBeforeAStepWhereTheRanksMeet) {
  const AsyncRun r = run_async_with_evaluations(config("stop-heard-eval", 1000, 10), true, {8, 12});
  EXPECT_EQ(r.ends, (std::vector<train::LoopEnd>{train::LoopEnd::Stopped, train::LoopEnd::Stopped}));
  EXPECT_EQ(r.stopped, (std::vector<int64_t>{9, 9}));
  for (const auto& mine : r.calls) {
    EXPECT_EQ(std::count(mine.begin(), mine.end(), "train 9"), 1);
    EXPECT_EQ(std::count(mine.begin(), mine.end(), "eval 10"), 0);
  }
}

// Without a request the ranks meet at each evaluation and go on: nobody stops early, every evaluation runs.
TEST(TrainLoop, RanksThatMeetWithoutARequestGoOn) {
  const AsyncRun r = run_async_with_evaluations(config("stop-heard-none-eval", 30, 10), false, {-1, -1});
  EXPECT_EQ(r.ends, (std::vector<train::LoopEnd>{train::LoopEnd::Finished, train::LoopEnd::Finished}));
  for (const auto& mine : r.calls)
    for (const std::string e : {"eval 10", "eval 20", "eval 30"}) EXPECT_EQ(std::count(mine.begin(), mine.end(), e), 1) << e;
}

// A rank that comes to the last step without having heard joins the exchange there: everyone stops after the
// step before it. Without any request the run ends normally.
TEST(TrainLoop, ARankThatNeverHeardJoinsTheStopAtTheLastStep) {
  for (const bool asked : {true, false}) {
    const train::Config c = config(asked ? "stop-heard-last" : "stop-heard-none", 10, 0);
    std::vector<int64_t> stopped(2, -2);
    comm::FakeWorld::run(2, [&](comm::Communicator& world) {
      train::TrainOptions o;
      o.quiet = true;
      ScriptedJob job(false, {0, 0});
      if (asked && world.rank() == 0) job.hears_from = 4;
      o.stop_requested = [&] { return asked && world.rank() == 0; };
      train::TrainLoop loop(c, o);
      EXPECT_EQ(loop.run(job, world, 1), asked ? train::LoopEnd::Stopped : train::LoopEnd::Finished);
      stopped[world.rank()] = loop.result().stopped_after;
    });
    if (asked) EXPECT_EQ(stopped, (std::vector<int64_t>{9, 9}));
    else EXPECT_EQ(stopped, (std::vector<int64_t>{-1, -1}));
  }
}

TEST(TrainLoop, AStoppedRunSavesTheLastStepDoneUnlessItSavedOnSchedule) {
  for (const int64_t every : {0, 4, 5}) {
    train::Config c = config("stop-save-" + std::to_string(every), 1000, 0);
    c.train.checkpoint_every = every;
    std::vector<std::vector<std::string>> calls(2);
    comm::FakeWorld::run(2, [&](comm::Communicator& world) {
      train::TrainOptions o;
      o.quiet = true;
      ScriptedJob job;
      int polls = 0;
      o.stop_requested = [&] { return world.rank() == 1 && ++polls >= 5; };
      train::TrainLoop loop(c, o);
      ASSERT_EQ(loop.run(job, world, 1), train::LoopEnd::Stopped);
      loop.finish_stopped(job, world.rank() == 0);
      calls[world.rank()] = job.calls;
    });
    for (int r = 0; r < 2; ++r) {  // every rank: the save is collective
      const auto saves_now = std::count(calls[r].begin(), calls[r].end(), "save now 5");
      EXPECT_EQ(saves_now, every == 5 ? 0 : 1) << "checkpoint_every " << every << ", rank " << r;
      EXPECT_EQ(calls[r].back(), every == 5 ? "save 5" : "save now 5") << "checkpoint_every " << every;
    }
  }
}

TEST(TrainLoop, HooksSeeEachStepAndCanEndTheRun) {
  const train::Config c = config("hooks", 20, 0);
  comm::FakeWorld::run(1, [&](comm::Communicator& world) {
    train::TrainOptions o;
    o.quiet = true;
    ScriptedJob job;
    std::vector<std::string> seen;
    train::StepHooks hooks;
    hooks.before_step = [&](int64_t s) { seen.push_back("before " + std::to_string(s)); };
    hooks.before_commit = [&](int64_t s) { seen.push_back("vote " + std::to_string(s)); };
    hooks.committed = [&](int64_t s) { seen.push_back("committed " + std::to_string(s)); };
    hooks.keep_going = [&](int64_t s) { return s < 2; };
    train::TrainLoop loop(c, o);
    EXPECT_EQ(loop.run(job, world, 1, hooks), train::LoopEnd::LeftByHook);
    EXPECT_EQ(seen, (std::vector<std::string>{"before 1", "vote 1", "committed 1", "before 2", "vote 2", "committed 2"}));
    EXPECT_EQ(loop.result().steps.size(), 2u);
  });
}
