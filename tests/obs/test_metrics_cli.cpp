// `crosstrain train` with obs.metrics_port: the endpoint scraped over HTTP while a real 2-rank run trains.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <thread>

#include "cli_fixture.h"
#include "http_get.h"

namespace crosstrain::testing {
namespace {

using namespace std::chrono_literals;

std::vector<std::string> with_port(std::vector<std::string> args, int port) {
  args.insert(args.end(), {"--set", "obs.metrics_port=" + std::to_string(port)});
  return args;
}

// Scrapes until `wanted` different steps have been seen or the deadline passes: step -> the scraped text.
std::map<int64_t, std::string> scrape_steps(int port, size_t wanted, std::chrono::seconds deadline) {
  std::map<int64_t, std::string> by_step;
  const auto end = std::chrono::steady_clock::now() + deadline;
  while (by_step.size() < wanted && std::chrono::steady_clock::now() < end) {
    const HttpReply reply = http_get(port, "/metrics");
    const std::string step = sample_value(reply.body, "crosstrain_step");
    if (reply.status == 200 && !step.empty() && std::stoll(step) > 0) by_step[std::stoll(step)] = reply.body;
    std::this_thread::sleep_for(100ms);
  }
  return by_step;
}

TEST(MetricsCli, ScrapedWhileTrainingAgreesWithMetricsJsonl) {
  const std::string dir = fresh_dir("metrics_cli_scrape");
  const int port = free_port();
  auto args = with_port(tiny_args(dir, 2, 120), port);
  // Rank 1 sleeps 25 ms per step, so that the run lasts a few seconds and is scraped in the middle.
  args.insert(args.end(), {"--set", "sync.slow_rank=1", "--set", "sync.slow_ms=25"});
  Process run(args);
  const std::string url = "metrics: http://127.0.0.1:" + std::to_string(port) + "/metrics";
  ASSERT_TRUE(run.wait_for_output(url, 120s)) << "no '" << url << "' line";
  const auto scraped = scrape_steps(port, 3, 120s);
  const ProcessResult result = run.wait(180s);
  ASSERT_EQ(result.exit_code(), 0) << result.output;
  ASSERT_GE(scraped.size(), 2u) << result.output;

  std::map<int64_t, nlohmann::json> rows;
  for (const auto& row : read_metrics(dir)) rows[row["step"].get<int64_t>()] = row;
  for (const auto& [step, text] : scraped) {
    SCOPED_TRACE("step " + std::to_string(step));
    ASSERT_TRUE(rows.count(step));
    EXPECT_LT(step, 120);  // scraped while training, not after
    EXPECT_EQ(std::stod(sample_value(text, "crosstrain_loss")), rows[step]["loss"].get<double>()) << text;
    EXPECT_EQ(std::stod(sample_value(text, "crosstrain_mfu")), rows[step]["mfu"].get<double>()) << text;
    EXPECT_EQ(sample_value(text, "crosstrain_up"), "1");
    EXPECT_FALSE(sample_value(text, "crosstrain_tokens_per_second").empty()) << text;
    EXPECT_FALSE(sample_value(text, "crosstrain_exposed_comm_seconds").empty()) << text;
    EXPECT_FALSE(sample_value(text, "crosstrain_wan_bytes_total").empty()) << text;
  }
}

TEST(MetricsCli, PortInUseFailsNamingIt) {
  // Hold a listening socket on a port, then ask the run to serve there.
  const int holder = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(holder, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(holder, 1), 0);
  socklen_t len = sizeof addr;
  getsockname(holder, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);

  const ProcessResult result = run_process(with_port(tiny_args(fresh_dir("metrics_cli_in_use"), 2, 5), port), {},
                                           std::chrono::milliseconds(120000));
  close(holder);
  EXPECT_NE(result.exit_code(), 0) << result.output;
  EXPECT_FALSE(result.timed_out);
  EXPECT_TRUE(contains(result.output, "127.0.0.1:" + std::to_string(port))) << result.output;
  EXPECT_TRUE(contains(result.output, "obs.metrics_port")) << result.output;
}

}  // namespace
}  // namespace crosstrain::testing
