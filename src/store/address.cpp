#include "crosstrain/store/address.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <cstring>

namespace crosstrain::comm::store {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::string without_scope(const std::string& numeric) { return numeric.substr(0, numeric.find('%')); }

std::string joined(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ", ") + p;
  return out;
}

}  // namespace

bool is_ip_literal(const std::string& text) {
  unsigned char buf[sizeof(in6_addr)];
  const std::string plain = without_scope(text);
  return inet_pton(AF_INET, plain.c_str(), buf) == 1 || inet_pton(AF_INET6, plain.c_str(), buf) == 1;
}

bool is_loopback_address(const std::string& numeric) {
  const std::string plain = without_scope(numeric);
  in_addr v4{};
  if (inet_pton(AF_INET, plain.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, plain.c_str(), &v6) != 1) return false;
  if (IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  return IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127;
}

bool is_loopback_name(const std::string& name) {
  const std::string n = lower(name);
  for (const char* known : {"localhost", "localhost.localdomain", "localhost6", "localhost6.localdomain6",
                            "ip6-localhost", "ip6-loopback"})
    if (n == known) return true;
  return ends_with(n, ".localhost");  // RFC 6761: all of .localhost is loopback
}

ListenPlan plan_listen(const std::string& name, const std::vector<std::string>& resolved) {
  ListenPlan plan;
  for (const auto& a : resolved)
    if (std::find(plan.addresses.begin(), plan.addresses.end(), a) == plan.addresses.end())
      plan.addresses.push_back(a);
  const bool asked_for_loopback = is_ip_literal(name) || is_loopback_name(name);
  const bool only_loopback = !plan.addresses.empty() &&
                             std::all_of(plan.addresses.begin(), plan.addresses.end(), is_loopback_address);
  if (name.empty() || asked_for_loopback || !only_loopback) return plan;
  // A machine name that resolves to loopback only: the other nodes need an address they can reach.
  const std::string loopback = joined(plan.addresses);
  const bool v4 = std::any_of(plan.addresses.begin(), plan.addresses.end(), [](const std::string& a) {
    return a.find(':') == std::string::npos;
  });
  const bool v6 = std::any_of(plan.addresses.begin(), plan.addresses.end(), [](const std::string& a) {
    return a.find(':') != std::string::npos;
  });
  plan.addresses.clear();
  if (v4) plan.addresses.push_back("0.0.0.0");
  if (v6) plan.addresses.push_back("::");
  plan.note = "'" + name + "' resolves only to loopback (" + loopback + "), which other machines cannot reach: " +
              "the rendezvous store listens on every interface instead (give --master / MASTER_ADDR this " +
              "node's network address to listen on that alone)";
  return plan;
}

}  // namespace crosstrain::comm::store
