// A plain HTTP/1.1 GET over a socket, so that the tests check the wire format themselves (no client library).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <string>

namespace crosstrain::testing {

struct HttpReply {
  bool ok = false;  // connected and read a status line
  int status = 0;
  std::string headers, body;
};

inline HttpReply http_get(int port, const std::string& path) {
  HttpReply reply;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return reply;
  }
  const std::string request = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (send(fd, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size())) {
    close(fd);
    return reply;
  }
  std::string raw;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) raw.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t end_of_headers = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.1 ", 0) != 0 || end_of_headers == std::string::npos) return reply;
  reply.ok = true;
  reply.status = std::stoi(raw.substr(9, 3));
  reply.headers = raw.substr(0, end_of_headers);
  reply.body = raw.substr(end_of_headers + 4);
  return reply;
}

// The value of the sample `series` (name with labels, e.g. `crosstrain_step` or `x{rank="1"}`), or "" if absent.
inline std::string sample_value(const std::string& text, const std::string& series) {
  const std::string key = "\n" + series + " ";
  const std::string padded = "\n" + text;
  const size_t at = padded.find(key);
  if (at == std::string::npos) return "";
  const size_t start = at + key.size();
  return padded.substr(start, padded.find('\n', start) - start);
}

}  // namespace crosstrain::testing
