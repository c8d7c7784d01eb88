// Which local addresses the rendezvous store listens on, given the name it was told (--master / MASTER_ADDR)
// and the numeric addresses that name resolved to. Pure logic, no sockets, so it is tested on its own.
//
// An IP literal or a loopback name ("localhost") is bound exactly as resolved: `--master 127.0.0.1` must not
// answer on other interfaces. Any other name is bound on every address it resolves to, except that a machine
// name resolving only to loopback addresses gets the wildcard address instead: Debian's /etc/hosts maps the
// machine's own name to 127.0.1.1, and under srun MASTER_ADDR is that name, so binding it literally would leave
// the store unreachable from every other node.
#pragma once

#include <string>
#include <vector>

namespace crosstrain::comm::store {

struct ListenPlan {
  std::vector<std::string> addresses;  // numeric addresses, one listening socket each, in resolution order
  std::string note;                    // one line for the log when the plan widens what was asked; else ""
};

ListenPlan plan_listen(const std::string& name, const std::vector<std::string>& resolved);

bool is_ip_literal(const std::string& text);             // "10.0.0.1", "::1", "fe80::1%eth0"
bool is_loopback_address(const std::string& numeric);    // 127.0.0.0/8, ::1, ::ffff:127.x.y.z
bool is_loopback_name(const std::string& name);          // "localhost" and its usual spellings

}  // namespace crosstrain::comm::store
