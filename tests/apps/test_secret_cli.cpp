// A job with a secret, as users run it: strangers that try to join its rendezvous store mid-run are refused with a
// line naming their address, and training goes on; a secret file others can read is refused before anything starts.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "cli_fixture.h"
#include "rogue_client.h"
#include "crosstrain/core/error.h"

using namespace crosstrain::testing;
using std::chrono::milliseconds;

namespace {


size_t metric_rows(const std::string& dir) {
  std::ifstream in(std::filesystem::path(dir) / "metrics.jsonl");
  size_t rows = 0;
  for (std::string line; std::getline(in, line);) rows += !line.empty();
  return rows;
}

std::string secret_file(const std::string& name, mode_t mode) {
  const auto path = std::filesystem::path(::testing::TempDir()) / name;
  std::filesystem::remove(path);
  std::ofstream(path) << "file-s3cret\n";
  chmod(path.c_str(), mode);
  return path.string();
}

}  // namespace

TEST(SecretCli, StrangersAreRefusedMidRunAndTrainingGoesOn) {
  const int steps = 150;
  const auto dir = fresh_dir("secret-run");
  const int port = free_port();
  std::vector<std::string> argv{kBin, "run", "--nproc", "2", "--master", "127.0.0.1:" + std::to_string(port), "--"};
  for (const auto& a : tiny_args(dir, 2, steps)) argv.push_back(a);
  Process job(argv, {{"CROSSTRAIN_SECRET", "s3cret"}, {"CROSSTRAIN_JOB_ID", "secret-test"}});
  // Mid-run: once the first step is recorded.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (metric_rows(dir) == 0 && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(milliseconds(20));
  ASSERT_GT(metric_rows(dir), 0u) << "training never started";
  const std::string wrong = rogue_join(port, "secret-test", "guess", 2);
  const std::string none = rogue_join(port, "secret-test", "", 2);
  const std::string other = rogue_join(port, "another-job", "s3cret", 2);
  const size_t rows_after_rogues = metric_rows(dir);

  auto res = job.wait(milliseconds(240000));
  ASSERT_EQ(res.exit_code(), 0) << res.output;
  EXPECT_LT(rows_after_rogues, static_cast<size_t>(steps)) << "the strangers came after the run";
  EXPECT_EQ(metric_rows(dir), static_cast<size_t>(steps));
  EXPECT_TRUE(contains(wrong, "refused this process: wrong job secret; set CROSSTRAIN_SECRET")) << wrong;
  EXPECT_TRUE(contains(none, "set CROSSTRAIN_SECRET")) << none;
  EXPECT_TRUE(contains(other, "job id 'secret-test'")) << other;
  EXPECT_TRUE(contains(res.output, "crosstrain: refused a store connection from 127.0.0.1:")) << res.output;
  EXPECT_TRUE(contains(res.output, ": it did not prove the job secret\n")) << res.output;
  EXPECT_TRUE(contains(res.output, ": it has no job secret\n")) << res.output;
  EXPECT_FALSE(contains(res.output, "s3cret")) << "the secret was printed:\n" << res.output;
}

TEST(SecretCli, ASecretFileReachesTheLaunchersStoreAndEveryRank) {
  // Ranks that hold a secret refuse a store that cannot prove it: the run only succeeds when the launcher's
  // store got the file's secret too.
  const auto dir = fresh_dir("secret-file");
  auto args = tiny_args(dir, 2, 3);
  args.insert(args.end(), {"--set", "run.secret_file=" + secret_file("job.secret", 0600)});
  auto res = run_process(args, {}, milliseconds(120000));
  EXPECT_EQ(res.exit_code(), 0) << res.output;
  EXPECT_FALSE(contains(res.output, "file-s3cret")) << res.output;
}

TEST(SecretCli, ASecretFileOthersCanReadIsRefusedBeforeAnythingStarts) {
  const auto dir = fresh_dir("secret-open");
  auto args = tiny_args(dir, 2, 3);
  const std::string path = secret_file("open.secret", 0644);
  args.insert(args.end(), {"--set", "run.secret_file=" + path});
  auto res = run_process(args, {}, milliseconds(60000));
  EXPECT_NE(res.exit_code(), 0) << res.output;
  EXPECT_TRUE(contains(res.output, "run.secret_file '" + path + "' is accessible by others (mode 0644)")) << res.output;
  EXPECT_TRUE(contains(res.output, "chmod 600")) << res.output;
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::path(dir) / "metrics.jsonl"));
}
