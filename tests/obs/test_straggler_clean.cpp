// No straggler warning in 1,000 clean steps (issue 14). Its own executable so that it runs alone (RUN_SERIAL):
// with other tests' ranks on the same 2 cores, one rank really is slower for a while, and would rightly be named.
#include <gtest/gtest.h>

#include "cli_fixture.h"

namespace crosstrain::testing {
namespace {

TEST(Stragglers, NoWarningInAThousandCleanSteps) {
  const std::string dir = fresh_dir("clean-1000");
  auto args = tiny_args(dir, 2, 1000);
  args.insert(args.end(), {"--set", "train.eval_every=0", "--set", "run.log_every=1000"});
  const ProcessResult r = run_process(args, {}, std::chrono::minutes(4));
  ASSERT_EQ(r.exit_code(), 0) << r.output;
  EXPECT_FALSE(contains(r.output, "warning: straggler")) << r.output;
  int exchanges = 0;
  for (const auto& row : read_metrics(dir))
    if (row.contains("straggler_rank")) {
      ++exchanges;
      EXPECT_EQ(row["straggler_rank"], -1) << row.dump();
    }
  EXPECT_EQ(exchanges, 200) << "one exchange every obs.straggler_every = 5 steps";
}

}  // namespace
}  // namespace crosstrain::testing
