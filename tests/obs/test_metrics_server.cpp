// The metrics endpoint over a real socket: GET /metrics, 404 elsewhere, a port in use, a prompt shutdown.
#include <gtest/gtest.h>

#include <chrono>

#include "crosstrain/core/error.h"
#include "crosstrain/obs/metrics_server.h"
#include "http_get.h"

namespace crosstrain::obs {
namespace {

using testing::http_get;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

TEST(MetricsServer, ServesUpThenThePublishedStep) {
  MetricsServer server("127.0.0.1", 0);
  ASSERT_GT(server.port(), 0);
  EXPECT_EQ(server.url(), "http://127.0.0.1:" + std::to_string(server.port()) + "/metrics");
  auto reply = http_get(server.port(), "/metrics");
  ASSERT_TRUE(reply.ok);
  EXPECT_EQ(reply.status, 200);
  EXPECT_NE(reply.headers.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << reply.headers;
  EXPECT_EQ(reply.body, prometheus_up_text());  // no step before one is published

  StepMetrics m;
  m.step = 3;
  m.loss = 4.25;
  server.publish(m);
  reply = http_get(server.port(), "/metrics");
  EXPECT_EQ(reply.status, 200);
  EXPECT_EQ(reply.body, prometheus_text(m));
  EXPECT_EQ(testing::sample_value(reply.body, "crosstrain_step"), "3");
}

TEST(MetricsServer, OtherPathsAreNotFound) {
  MetricsServer server("127.0.0.1", 0);
  const auto reply = http_get(server.port(), "/");
  ASSERT_TRUE(reply.ok);
  EXPECT_EQ(reply.status, 404);
  EXPECT_NE(reply.body.find("/metrics"), std::string::npos) << reply.body;
  EXPECT_EQ(http_get(server.port(), "/metrics/extra").status, 404);
}

TEST(MetricsServer, PortInUseIsAUsageErrorNamingIt) {
  MetricsServer first("127.0.0.1", 0);
  const std::string where = "127.0.0.1:" + std::to_string(first.port());
  try {
    MetricsServer second("127.0.0.1", first.port());
    FAIL() << "a second server listened on " << where;
  } catch (const UsageError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find(where), std::string::npos) << message;
    EXPECT_NE(message.find("in use"), std::string::npos) << message;
    EXPECT_NE(message.find("obs.metrics_port"), std::string::npos) << message;
  }
  EXPECT_EQ(http_get(first.port(), "/metrics").status, 200);  // the first one still serves
}

TEST(MetricsServer, StopsPromptlyEvenWithAnIdleClient) {
  auto server = std::make_unique<MetricsServer>("127.0.0.1", 0);
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(server->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);  // connected, sends nothing
  const auto start = Clock::now();
  server.reset();
  EXPECT_LT(seconds_since(start), 3.0);
  close(fd);
  const auto idle_start = Clock::now();
  MetricsServer{"127.0.0.1", 0};
  EXPECT_LT(seconds_since(idle_start), 0.5);
}

TEST(MetricsServer, OffUnlessAPortIsSet) {
  ObsConfig config;
  EXPECT_EQ(start_metrics_server(config, true), nullptr);
}

}  // namespace
}  // namespace crosstrain::obs
