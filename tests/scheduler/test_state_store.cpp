// The SQLite state: round trips, transactions, refusals of files that are not ours.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <cstdio>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "crosstrain/core/error.h"
#include "crosstrain/scheduler/state_store.h"

namespace crosstrain::scheduler {
namespace {

std::string temp_path(const std::string& name) {
  const std::string p = (std::filesystem::temp_directory_path() /
                         ("ct_sched_" + std::to_string(::getpid()) + "_" + name)).string();
  for (const char* s : {"", "-wal", "-shm"}) std::remove((p + s).c_str());
  return p;
}

JobRecord sample_job() {
  JobRecord j;
  j.spec.name = "llama";
  j.spec.model = planner::model_preset("llama-7b");
  j.spec.ranks = 24;
  j.spec.global_batch = 480;
  j.spec.steps = 777;
  j.spec.checkpoint_every = 25;
  j.spec.qos = {3600.5, 120.25, 2.5};
  j.submitted_s = j.updated_s = 12.5;
  return j;
}

TEST(StateStore, JobsAndPlacementsRoundTripThroughANewStore) {
  const std::string path = temp_path("roundtrip.db");
  JobRecord j = sample_job();
  {
    StateStore s(path);
    j.id = s.add_job(j);
    j.state = JobState::Running;
    j.attempts = 2;
    j.step = 150;
    j.placement = PlacementRecord{{{"east", 16, "dp=8 tp=2 pp=1"}, {"west", 8, "dp=4 tp=2 pp=1"}},
                                  "dp=12 tp=2 pp=1 zero=1", planner::LayoutSync::DiLoCo, 50, 0.75, 1.5, 99.5, 2};
    j.updated_s = 30;
    s.update_job(j);
  }
  StateStore again(path);
  const auto back = again.job(j.id);
  ASSERT_TRUE(back);
  EXPECT_EQ(job_spec_to_json(back->spec), job_spec_to_json(j.spec));
  EXPECT_EQ(back->spec.model.parameters(), j.spec.model.parameters());
  EXPECT_EQ(back->state, JobState::Running);
  EXPECT_EQ(back->attempts, 2);
  EXPECT_EQ(back->step, 150);
  EXPECT_EQ(back->updated_s, 30);
  ASSERT_TRUE(back->placement);
  ASSERT_EQ(back->placement->shares.size(), 2u);
  EXPECT_EQ(back->placement->shares[1].cluster, "west");
  EXPECT_EQ(back->placement->shares[1].ranks, 8);
  EXPECT_EQ(back->placement->sync, planner::LayoutSync::DiLoCo);
  EXPECT_EQ(back->placement->inner_steps, 50);
  EXPECT_EQ(back->placement->cost, 99.5);
  EXPECT_EQ(back->placement->attempt, 2);
  // The sync is stored as its word: databases written before it was a type, and the dashboard, read the same text.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  std::string stored;
  const auto first_column = [](void* out, int, char** values, char**) {
    *static_cast<std::string*>(out) = values[0] ? values[0] : "";
    return 0;
  };
  EXPECT_EQ(sqlite3_exec(db, "SELECT sync FROM placements", first_column, &stored, nullptr), SQLITE_OK);
  sqlite3_close(db);
  EXPECT_EQ(stored, "diloco");
  // Clearing the placement deletes it.
  JobRecord done = *back;
  done.state = JobState::Done;
  done.placement.reset();
  again.update_job(done);
  EXPECT_FALSE(again.job(j.id)->placement);
  EXPECT_EQ(again.events(j.id).front().kind, "submitted");
}

TEST(StateStore, ATransactionThatIsNotCommittedLeavesNothing) {
  const std::string path = temp_path("rollback.db");
  StateStore s(path);
  {
    StateStore::Transaction t(s);
    s.add_job(sample_job());
    s.add_event(1, 0, "x", "y");
  }  // destroyed without commit
  EXPECT_TRUE(s.jobs().empty());
  EXPECT_TRUE(s.events().empty());
  EXPECT_EQ(s.last_job_id(), 0);
}

TEST(StateStore, RefusesAFileThatIsNotSQLite) {
  const std::string path = temp_path("garbage.db");
  std::ofstream(path) << std::string(4096, 'x');
  try {
    StateStore s(path);
    FAIL() << "opened a garbage file";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("not a crosstrain scheduler state"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
}

TEST(StateStore, RefusesAnotherProgramsDatabaseAndANewerSchema) {
  const std::string foreign = temp_path("foreign.db");
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(foreign.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE photos(id INTEGER)", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  try {
    StateStore s(foreign);
    FAIL() << "opened another program's database";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("another program"), std::string::npos) << e.what();
  }

  const std::string newer = temp_path("newer.db");
  { StateStore s(newer); }
  ASSERT_EQ(sqlite3_open(newer.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "PRAGMA user_version=99", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  try {
    StateStore s(newer);
    FAIL() << "opened a newer schema";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("newer"), std::string::npos) << e.what();
  }
}

TEST(StateStore, RecipeJobSpecsRoundTripAndBadOnesAreRefused) {
  JobSpec j;
  j.name = "tiny";
  j.ranks = 4;
  j.min_ranks = 2;
  j.recipe = "/abs/recipes/gpt-tiny.toml";
  j.overrides = {"train.lr=0.001", "sync.inner_steps=5"};
  const JobSpec back = job_spec_from_json(job_spec_to_json(j));
  EXPECT_EQ(back.min_ranks, 2);
  EXPECT_EQ(back.least_ranks(), 2);
  EXPECT_EQ(back.recipe, j.recipe);
  EXPECT_EQ(back.overrides, j.overrides);
  // The recipe's text travels with the spec (sites without the submitter's disk), bounded.
  j.recipe_text = "[model]\nn_layer = 2\n";
  EXPECT_EQ(job_spec_from_json(job_spec_to_json(j)).recipe_text, j.recipe_text);
  JobSpec huge = j;
  huge.recipe_text.assign(300 << 10, '#');
  EXPECT_THROW(job_spec_from_json(job_spec_to_json(huge)), UsageError);
  EXPECT_THROW(job_spec_from_json(R"({"ranks": 4, "recipe_text": "x = 1"})"), UsageError) << "text without a name";
  // The recipe may not decide what the scheduler owns: the bundled recipes' neutral values pass, the scheduler's own
  // settings win over run.dir and the like, anything else is refused (as it is from --set).
  JobSpec owned = j;
  owned.recipe_text = "[run]\ndir = \"runs/x\"\nsecret_file = \"\"\nwork_log = false\n[comm]\nencrypt = false\n";
  EXPECT_NO_THROW(job_spec_from_json(job_spec_to_json(owned)));
  for (const std::string bad : {"[comm]\nencrypt = true\n", "[run]\nsecret_file = \"/etc/other\"\n",
                                "[debug]\nfault_step = 3\n", "[sync]\ntopology = \"/x.toml\"\n", "[model\n",
                                "[[debug]]\nfault_step = 3\n", "comm = { encrypt = true }\n"}) {
    owned.recipe_text = bad;
    EXPECT_THROW(job_spec_from_json(job_spec_to_json(owned)), UsageError) << bad;
  }
  j.recipe_text.clear();
  EXPECT_EQ(job_spec_from_json(R"({"ranks": 4})").least_ranks(), 4) << "0: exactly ranks";
  try {
    job_spec_from_json(R"({"ranks": 4, "set": ["train.lr"]})");
    ADD_FAILURE() << "an override without = was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("'train.lr' is not KEY=VALUE"), std::string::npos) << e.what();
  }
  EXPECT_THROW(job_spec_from_json(R"({"ranks": 4, "min_ranks": 5})"), UsageError);
  // Who it is for and how it ranks (quotas, priorities), checked as they come in.
  j.user = "ann";
  j.priority = -7;
  const JobSpec who = job_spec_from_json(job_spec_to_json(j));
  EXPECT_EQ(who.user, "ann");
  EXPECT_EQ(who.priority, -7);
  EXPECT_EQ(job_spec_from_json(R"({"ranks": 1})").user, "default");
  EXPECT_THROW(job_spec_from_json(R"({"ranks": 1, "user": "a b"})"), UsageError);
  EXPECT_THROW(job_spec_from_json(R"({"ranks": 1, "priority": 1001})"), UsageError);
}

// A state file of schema 1 (before absent shares) opens and gains the column; its placements read as whole.
TEST(StateStore, ASchemaOneFileIsMigrated) {
  const std::string path = temp_path("v1.db");
  {
    StateStore s(path);
    JobSpec spec;
    spec.ranks = 2;
    JobRecord j;
    j.spec = spec;
    j.state = JobState::Running;
    PlacementRecord p;
    p.shares = {{"a", 1, "dp=1 tp=1 pp=1"}, {"b", 1, "dp=1 tp=1 pp=1"}};
    p.attempt = 1;
    j.placement = p;
    s.add_job(j);
  }
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  // Schema 1's placement_shares: the same columns without `absent`.
  ASSERT_EQ(sqlite3_exec(db,
                         "CREATE TABLE old AS SELECT job_id, position, cluster, ranks, layout FROM placement_shares;"
                         "DROP TABLE placement_shares; ALTER TABLE old RENAME TO placement_shares;"
                         "DROP TABLE usage;"
                         "CREATE TABLE oldp AS SELECT job_id, attempt, layout, sync, inner_steps, step_s, wan_gbps, "
                         "cost FROM placements; DROP TABLE placements; ALTER TABLE oldp RENAME TO placements;"
                         "PRAGMA user_version=1",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  StateStore s(path);
  const auto jobs = s.jobs();
  ASSERT_EQ(jobs.size(), 1u);
  ASSERT_TRUE(jobs[0].placement);
  ASSERT_EQ(jobs[0].placement->shares.size(), 2u);
  EXPECT_FALSE(jobs[0].placement->shares[1].absent);
  JobRecord j = jobs[0];
  j.placement->shares[1].absent = true;
  s.update_job(j);
  EXPECT_TRUE(s.jobs()[0].placement->shares[1].absent) << "the migrated file does not keep an absent share";
  EXPECT_FALSE(s.jobs()[0].placement->standby) << "a placement from before standbys has none";
  EXPECT_FALSE(s.jobs()[0].placement->rendezvous_moved);
  j.placement->standby = j.placement->rendezvous_moved = true;
  s.update_job(j);
  EXPECT_TRUE(s.jobs()[0].placement->standby) << "the migrated file does not keep a standby";
  EXPECT_TRUE(s.jobs()[0].placement->rendezvous_moved) << "the migrated file does not keep a moved rendezvous";
  EXPECT_FALSE(s.jobs()[0].placement->share0_stays_out);
  j.placement->share0_stays_out = true;
  s.update_job(j);
  EXPECT_TRUE(s.jobs()[0].placement->share0_stays_out) << "a share 0 that must stay out would come back";
  EXPECT_TRUE(s.jobs()[0].placement->rendezvous_moved);
}

TEST(StateStore, JobSpecJsonNamesTheBadField) {
  EXPECT_THROW(job_spec_from_json("{"), UsageError);
  try {
    job_spec_from_json(R"({"ranks": "many"})");
    FAIL();
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("ranks"), std::string::npos) << e.what();
  }
  const JobSpec s = job_spec_from_json(R"({"model": "gpt2", "ranks": 8, "qos": {"max_wan_gbps": 0}})");
  EXPECT_EQ(s.model.name, "gpt2");
  EXPECT_EQ(s.ranks, 8);
  EXPECT_EQ(s.qos.max_wan_gbps, 0);
}

}  // namespace
}  // namespace crosstrain::scheduler

// Issue 34: a submitter's overrides cannot move the job's folders or addresses, change how it communicates or
// inject faults; every other key is theirs.
TEST(StateStore, AJobsOverridesCannotTakeTheSchedulersKeys) {
  auto spec_with = [](const std::string& set) {
    return std::string(R"({"name": "j", "ranks": 2, "recipe": "/r/gpt-tiny.toml", "set": [")") + set + R"("]})";
  };
  for (const char* owned : {"run.dir=/tmp/x", "run.secret_file=/etc/shadow", "comm.encrypt=off", "comm.identity=/k",
                            "obs.metrics_host=0.0.0.0", "obs.metrics_port=80", "sync.topology=/t.toml",
                            "debug.elastic_kill=0@1", "run.work_log=true"}) {
    try {
      crosstrain::scheduler::job_spec_from_json(spec_with(owned));
      ADD_FAILURE() << owned << " was accepted";
    } catch (const crosstrain::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("remove it from the job's overrides"), std::string::npos) << e.what();
    }
  }
  for (const char* free : {"train.lr=0.001", "run.name=mine", "sync.inner_steps=20", "model.n_layer=2", "comm.timeout_s=20"})
    EXPECT_NO_THROW(crosstrain::scheduler::job_spec_from_json(spec_with(free))) << free;
}

// Bodies nest at most kMaxJsonDepth objects and arrays, counted before any parser runs; brackets inside strings
// do not count.
TEST(StateStore, JsonNestingIsBoundedBeforeParsing) {
  using crosstrain::scheduler::json_nesting_error;
  EXPECT_EQ(json_nesting_error(R"({"a": [1, {"b": [2]}]})", 4), "");
  EXPECT_NE(json_nesting_error(R"({"a": [1, {"b": [2]}]})", 3), "");
  EXPECT_EQ(json_nesting_error(R"({"a": "[[[[[[[[", "b": "\"[[[["})", 1), "");
  EXPECT_NE(json_nesting_error(std::string(100000, '['), 16), "");
  try {
    crosstrain::scheduler::job_spec_from_json(std::string(20, '[') + std::string(20, ']'));
    ADD_FAILURE() << "a deeply nested body was parsed";
  } catch (const crosstrain::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("nested deeper than 16"), std::string::npos) << e.what();
  }
}
