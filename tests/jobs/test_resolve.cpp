// A config is resolved once against its world size (jobs/trainer.h): the result carries the layout the model
// family worked out, a config that cannot run on that many ranks is refused there, and a Trainer refuses a
// resolution made for another world instead of working it out again.
#include <gtest/gtest.h>

#include <string>

#include "crosstrain/comm/backends/fake.h"
#include "crosstrain/core/error.h"
#include "crosstrain/jobs/trainer.h"
#include "train_fixture.h"

using namespace crosstrain;

TEST(Resolve, ADecoderRunCarriesTheLayoutItResolvedTo) {
  train::Config c = crosstrain::testing::tiny_config("resolve-layout");
  c.parallel.tp = 2;
  c.train.micro_batches = 2;
  const train::ResolvedRun run = train::resolve(c, 4);
  ASSERT_TRUE(run.dims.has_value());
  EXPECT_EQ(run.world, 4);
  EXPECT_EQ(run.dims->tp(), 2);
  EXPECT_EQ(run.dims->dp(), 2);
  EXPECT_EQ(run.dims->microbatches, 2);
  EXPECT_EQ(run.dims->bounds.size(), 2u) << "one pipeline stage: its layer bounds";
}

TEST(Resolve, ADlrmRunHasNoMeshLayout) {
  train::Config c = crosstrain::testing::tiny_config("resolve-dlrm");
  c.model.arch = models::ModelArch::Dlrm;
  c.data.path.clear();
  EXPECT_FALSE(train::resolve(c, 2).dims.has_value());
}

TEST(Resolve, AConfigThatCannotRunOnThisWorldIsRefusedNamingTheKey) {
  train::Config c = crosstrain::testing::tiny_config("resolve-refused");
  c.train.global_batch = 6;  // 4 data-parallel ranks
  try {
    train::resolve(c, 4);
    FAIL() << "a global batch of 6 over 4 replicas was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("train.global_batch = 6"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(train::resolve(c, 3));
}

TEST(Resolve, ATrainerRefusesARunResolvedForAnotherWorld) {
  const train::ResolvedRun run = train::resolve(crosstrain::testing::tiny_config("resolve-world"), 2);
  std::string message;
  comm::FakeWorld::run(1, [&](comm::Communicator& world) {
    try {
      train::Trainer trainer(run, world);
    } catch (const Error& e) {
      message = e.what();
    }
  });
  EXPECT_NE(message.find("resolved for 2 ranks, the job has 1"), std::string::npos) << message;
}
