// Raw-socket probes for the rendezvous store tests: a stranger that connects and sends what it likes.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "crosstrain/store/protocol.h"

namespace crosstrain::testing {

// A connected socket to ip:port, or -1 (retrying for up to `patience` while nothing listens).
inline int raw_connect(const std::string& ip, int port,
                       std::chrono::milliseconds patience = std::chrono::milliseconds(0)) {
  const auto until = std::chrono::steady_clock::now() + patience;
  for (;;) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, ip.c_str(), &addr.sin_addr);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
    close(fd);
    if (std::chrono::steady_clock::now() >= until) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

inline void raw_send(int fd, const std::vector<uint8_t>& bytes) {
  (void)!send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
}

// The probe that froze c10d's store: one zero byte, then an 8-byte length of 1 GiB, then nothing.
inline std::vector<uint8_t> gigabyte_prefix() {
  std::vector<uint8_t> b{0};
  const uint64_t gib = uint64_t{1} << 30;
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<uint8_t>(gib >> (8 * i)));
  return b;
}

inline std::vector<uint8_t> garbage(size_t n) {
  std::vector<uint8_t> b(n);
  uint32_t x = 12345;
  for (auto& v : b) v = static_cast<uint8_t>((x = x * 1103515245 + 12345) >> 16);
  return b;
}

// Whether the peer closed `fd` within `deadline` (reading and discarding whatever it sent).
inline bool closed_by_peer(int fd, std::chrono::milliseconds deadline) {
  const auto until = std::chrono::steady_clock::now() + deadline;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    char buf[256];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return true;
  }
}

// A raw connection admitted by the store as `rank` of `world` (its Ok reply read), or -1 when refused or closed.
inline int raw_member(int port, int rank, int world) {
  using namespace crosstrain::comm::store;
  int fd = raw_connect("127.0.0.1", port);
  if (fd < 0) return -1;
  auto out = encode_preamble();
  auto hello = encode_frame(encode_hello(Hello{rank, world, {}}));
  out.insert(out.end(), hello.begin(), hello.end());
  raw_send(fd, out);
  uint8_t reply[5];
  size_t got = 0;
  while (got < sizeof reply) {
    pollfd p{fd, POLLIN, 0};
    ssize_t n = poll(&p, 1, 5000) > 0 ? recv(fd, reply + got, sizeof reply - got, 0) : 0;
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  if (got < sizeof reply || reply[4] != static_cast<uint8_t>(Code::Ok)) {
    close(fd);
    return -1;
  }
  // The rest of the Ok reply (its fields) stays unread: the server does not wait for it to be read.
  return fd;
}

// A little-endian u32, as the store's length prefixes are.
inline std::vector<uint8_t> le32(uint32_t v) {
  return {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)};
}

// Descriptors this process has open.
inline size_t open_descriptors() {
  size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) n += entry.exists() ? 1 : 0;
  return n;
}

// Peak resident memory of a process in MiB (VmHWM), or -1.
inline double peak_rss_mib(const std::string& pid = "self") {
  std::ifstream in("/proc/" + pid + "/status");
  std::string key;
  while (in >> key) {
    if (key == "VmHWM:") {
      double kib = 0;
      in >> kib;
      return kib / 1024.0;
    }
    std::getline(in, key);
  }
  return -1;
}

}  // namespace crosstrain::testing
