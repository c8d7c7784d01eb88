// Which addresses the rendezvous store listens on, for a name and what it resolved to (no sockets).
#include <gtest/gtest.h>

#include "crosstrain/store/address.h"

using namespace crosstrain::comm::store;
using Addresses = std::vector<std::string>;

TEST(StoreAddress, AnIpLiteralIsBoundExactly) {
  EXPECT_EQ(plan_listen("127.0.0.1", {"127.0.0.1"}).addresses, Addresses{"127.0.0.1"});
  EXPECT_EQ(plan_listen("::1", {"::1"}).addresses, Addresses{"::1"});
  EXPECT_EQ(plan_listen("10.1.2.3", {"10.1.2.3"}).addresses, Addresses{"10.1.2.3"});
  EXPECT_EQ(plan_listen("127.0.0.1", {"127.0.0.1"}).note, "");
}

TEST(StoreAddress, LocalhostIsBoundOnEveryLoopbackAddressItNames) {
  // Binding only the first (often ::1) left IPv4 clients of "localhost" unable to connect.
  const ListenPlan plan = plan_listen("localhost", {"::1", "127.0.0.1"});
  EXPECT_EQ(plan.addresses, (Addresses{"::1", "127.0.0.1"}));
  EXPECT_EQ(plan.note, "");
  EXPECT_EQ(plan_listen("LOCALHOST", {"127.0.0.1"}).addresses, Addresses{"127.0.0.1"});
}

TEST(StoreAddress, AMachineNameIsBoundOnEveryAddressItResolvesTo) {
  const ListenPlan plan = plan_listen("node01", {"10.0.0.5", "192.168.1.5", "10.0.0.5"});
  EXPECT_EQ(plan.addresses, (Addresses{"10.0.0.5", "192.168.1.5"}));  // duplicates once
  EXPECT_EQ(plan.note, "");
  // A loopback address among real ones stays: the name does reach other machines.
  EXPECT_EQ(plan_listen("node01", {"127.0.1.1", "10.0.0.5"}).addresses, (Addresses{"127.0.1.1", "10.0.0.5"}));
}

TEST(StoreAddress, AMachineNameThatIsOnlyLoopbackGetsTheWildcardAndALogLine) {
  // Debian's /etc/hosts: "127.0.1.1 node01"; under srun MASTER_ADDR is that name.
  const ListenPlan plan = plan_listen("node01", {"127.0.1.1"});
  EXPECT_EQ(plan.addresses, Addresses{"0.0.0.0"});
  EXPECT_NE(plan.note.find("'node01'"), std::string::npos) << plan.note;
  EXPECT_NE(plan.note.find("127.0.1.1"), std::string::npos) << plan.note;
  EXPECT_NE(plan.note.find("every interface"), std::string::npos) << plan.note;
  EXPECT_EQ(plan_listen("node01", {"::1"}).addresses, Addresses{"::"});
  EXPECT_EQ(plan_listen("node01", {"127.0.1.1", "::1"}).addresses, (Addresses{"0.0.0.0", "::"}));
}

TEST(StoreAddress, TheEmptyNameKeepsTheWildcardsItResolvedTo) {
  EXPECT_EQ(plan_listen("", {"0.0.0.0", "::"}).addresses, (Addresses{"0.0.0.0", "::"}));
}

TEST(StoreAddress, ClassifiesLiteralsAndLoopback) {
  EXPECT_TRUE(is_ip_literal("10.0.0.1"));
  EXPECT_TRUE(is_ip_literal("fe80::1%eth0"));
  EXPECT_FALSE(is_ip_literal("node01"));
  EXPECT_TRUE(is_loopback_address("127.0.1.1"));
  EXPECT_TRUE(is_loopback_address("::1"));
  EXPECT_TRUE(is_loopback_address("::ffff:127.0.0.1"));
  EXPECT_FALSE(is_loopback_address("10.0.0.1"));
  EXPECT_FALSE(is_loopback_address("::"));
  EXPECT_TRUE(is_loopback_name("localhost"));
  EXPECT_TRUE(is_loopback_name("ip6-localhost"));
  EXPECT_TRUE(is_loopback_name("app.localhost"));
  EXPECT_FALSE(is_loopback_name("node01"));
}
