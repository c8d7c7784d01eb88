// crosstrain-delay-relay: holds every packet of a TUN device for a fixed time, then writes it back.
//
// The emulated wide-area testbed (scripts/testbed) routes inter-cluster packets of its router namespace into a
// persistent TUN device; this program reads them, keeps them in a FIFO with their due time, and writes each one
// back into the same device when it is due, where the kernel routes it on to its destination. That adds a fixed
// one-way delay (the kernel of these machines has no netem), optionally with random loss. The queue is a FIFO
// and the delay is constant, so packets never overtake one another.
//
// It can also play the attacker on the path (tests of comm.encrypt, issue 34): --capture FILE appends the TCP payload
// of every packet to FILE (what a tap on the wide-area link reads), and --flip-every N flips one payload byte of
// every Nth TCP segment that carries data, fixing the TCP checksum as an attacker would (so the receiver's kernel
// accepts the segment and hands the changed bytes to the application). SIGUSR2 arms one such flip, of the next
// segment that carries at least kBulkBytes of data (bulk traffic: a tensor, not a handshake): `testbed tamper`.
//
// No libtorch, no threads: one loop around ppoll() whose timeout is the head packet's due time. SIGTERM, SIGINT
// and SIGHUP end it at once (queued packets are dropped: the link is going away).

#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <random>
#include <string>
#include <vector>

namespace {

volatile sig_atomic_t g_stop = 0;
volatile sig_atomic_t g_stats = 0;
volatile sig_atomic_t g_armed = 0;  // flips asked for with SIGUSR2, not done yet

// The smallest segment an armed flip changes: the bulk data of a collective, not a store request or a handshake.
constexpr size_t kBulkBytes = 1000;

void on_stop(int) { g_stop = 1; }
void on_stats(int) { g_stats = 1; }
void on_arm(int) { g_armed = g_armed + 1; }

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

struct Packet {
  int64_t due_ns;
  std::vector<uint8_t> bytes;
};

struct Options {
  std::string dev;
  double delay_ms = 0;
  double loss = 0;  // probability in [0, 1)
  uint64_t seed = 1;
  size_t max_queue_bytes = size_t(64) << 20;
  std::string pidfile;
  std::string capture;       // append every TCP payload here
  uint64_t flip_every = 0;   // flip a payload byte of every Nth data segment; 0: never
};

// The TCP payload of an IPv4 packet: [begin, end) within it, or begin == end when it is none.
struct Payload {
  size_t ip_header = 0, tcp_begin = 0, begin = 0, end = 0;
};
Payload tcp_payload(const uint8_t* p, size_t n) {
  Payload out;
  if (n < 20 || (p[0] >> 4) != 4 || p[9] != 6) return out;
  const size_t ihl = size_t(p[0] & 0x0f) * 4;
  const size_t total = size_t(p[2]) << 8 | p[3];
  if (ihl < 20 || total > n || total < ihl + 20) return out;
  const size_t doff = size_t(p[ihl + 12] >> 4) * 4;
  if (doff < 20 || ihl + doff > total) return out;
  out.ip_header = ihl;
  out.tcp_begin = ihl;
  out.begin = ihl + doff;
  out.end = total;
  return out;
}

// Recomputes the TCP checksum of an IPv4 packet (pseudo-header, header and payload).
void fix_tcp_checksum(uint8_t* p, const Payload& t) {
  const size_t tcp_len = t.end - t.tcp_begin;
  p[t.tcp_begin + 16] = p[t.tcp_begin + 17] = 0;
  uint64_t sum = 0;
  for (int i = 12; i < 20; i += 2) sum += uint32_t(p[i]) << 8 | p[i + 1];  // source and destination address
  sum += 6 + tcp_len;                                                       // protocol, TCP length
  for (size_t i = 0; i + 1 < tcp_len; i += 2) sum += uint32_t(p[t.tcp_begin + i]) << 8 | p[t.tcp_begin + i + 1];
  if (tcp_len % 2) sum += uint32_t(p[t.tcp_begin + tcp_len - 1]) << 8;
  while (sum >> 16) sum = (sum & 0xffff) + (sum >> 16);
  const uint16_t c = uint16_t(~sum);
  p[t.tcp_begin + 16] = uint8_t(c >> 8);
  p[t.tcp_begin + 17] = uint8_t(c);
}

[[noreturn]] void usage(const char* argv0, int code) {
  std::fprintf(code ? stderr : stdout,
               "usage: %s --dev TUN --delay-ms MS [--loss P] [--seed N] [--max-queue-mb MB] [--pidfile FILE]\n"
               "          [--capture FILE] [--flip-every N]\n"
               "Attaches to the TUN device TUN (created with `ip tuntap add mode tun dev TUN`), holds each packet\n"
               "read from it for MS milliseconds (FIFO, no reordering) and writes it back. --loss drops a packet\n"
               "with probability P (0..1). The pid file is written once the device is attached. SIGTERM stops it.\n"
               "SIGUSR1 prints counters to stderr. --capture appends every TCP payload to FILE; --flip-every N\n"
               "flips a payload byte of every Nth data segment and fixes its checksum (an attacker on the path);\n"
               "SIGUSR2 does that once, to the next segment with at least 1000 bytes of data.\n",
               argv0);
  std::exit(code);
}

Options parse(int argc, char** argv) {
  Options o;
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) {
      std::fprintf(stderr, "crosstrain-delay-relay: %s needs a value\n", argv[i]);
      std::exit(2);
    }
    return argv[++i];
  };
  auto number = [&](const std::string& flag, const std::string& s) {
    char* end = nullptr;
    errno = 0;
    double v = std::strtod(s.c_str(), &end);
    if (errno || end == s.c_str() || *end || !(v >= 0)) {
      std::fprintf(stderr, "crosstrain-delay-relay: %s wants a non-negative number, got '%s'\n", flag.c_str(),
                   s.c_str());
      std::exit(2);
    }
    return v;
  };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") usage(argv[0], 0);
    else if (a == "--dev") o.dev = value(i);
    else if (a == "--delay-ms") o.delay_ms = number(a, value(i));
    else if (a == "--loss") o.loss = number(a, value(i));
    else if (a == "--seed") o.seed = uint64_t(number(a, value(i)));
    else if (a == "--max-queue-mb") o.max_queue_bytes = size_t(number(a, value(i)) * (1 << 20));
    else if (a == "--pidfile") o.pidfile = value(i);
    else if (a == "--capture") o.capture = value(i);
    else if (a == "--flip-every") o.flip_every = uint64_t(number(a, value(i)));
    else {
      std::fprintf(stderr, "crosstrain-delay-relay: unknown argument '%s'\n", a.c_str());
      usage(argv[0], 2);
    }
  }
  if (o.dev.empty()) {
    std::fprintf(stderr, "crosstrain-delay-relay: --dev is required\n");
    usage(argv[0], 2);
  }
  if (o.dev.size() >= IFNAMSIZ) {
    std::fprintf(stderr, "crosstrain-delay-relay: device name '%s' is too long\n", o.dev.c_str());
    std::exit(2);
  }
  if (o.loss >= 1) {
    std::fprintf(stderr, "crosstrain-delay-relay: --loss must be below 1\n");
    std::exit(2);
  }
  return o;
}

int open_tun(const std::string& dev) {
  int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    std::fprintf(stderr, "crosstrain-delay-relay: open /dev/net/tun: %s\n", std::strerror(errno));
    std::exit(1);
  }
  ifreq ifr{};
  ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
  std::strncpy(ifr.ifr_name, dev.c_str(), IFNAMSIZ - 1);
  if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
    std::fprintf(stderr, "crosstrain-delay-relay: attach to TUN device '%s': %s\n", dev.c_str(), std::strerror(errno));
    std::exit(1);
  }
  return fd;
}

void write_pidfile(const std::string& path) {
  if (path.empty()) return;
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f || std::fprintf(f, "%d\n", int(getpid())) < 0 || std::fclose(f) != 0 ||
      std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::fprintf(stderr, "crosstrain-delay-relay: write pid file %s: %s\n", path.c_str(), std::strerror(errno));
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options opt = parse(argc, argv);

  // Signals stay blocked except inside ppoll(), so a stop request can never be missed between checks.
  sigset_t blocked, during_poll;
  sigemptyset(&blocked);
  for (int s : {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2}) sigaddset(&blocked, s);
  sigprocmask(SIG_BLOCK, &blocked, &during_poll);
  for (int s : {SIGTERM, SIGINT, SIGHUP}) {
    struct sigaction sa{};
    sa.sa_handler = on_stop;
    sigaction(s, &sa, nullptr);
  }
  struct sigaction su{};
  su.sa_handler = on_stats;
  sigaction(SIGUSR1, &su, nullptr);
  struct sigaction sarm{};
  sarm.sa_handler = on_arm;
  sigaction(SIGUSR2, &sarm, nullptr);
  signal(SIGPIPE, SIG_IGN);
  for (int s : {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2}) sigdelset(&during_poll, s);

  int fd = open_tun(opt.dev);
  FILE* capture = nullptr;
  if (!opt.capture.empty() && !(capture = std::fopen(opt.capture.c_str(), "ab"))) {
    std::fprintf(stderr, "crosstrain-delay-relay: open %s: %s\n", opt.capture.c_str(), std::strerror(errno));
    return 1;
  }
  uint64_t data_segments = 0, n_flipped = 0;
  write_pidfile(opt.pidfile);

  const int64_t delay_ns = int64_t(opt.delay_ms * 1e6);
  std::mt19937_64 rng(opt.seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::deque<Packet> queue;
  size_t queued_bytes = 0;
  uint64_t n_in = 0, n_out = 0, n_lost = 0, n_overflow = 0, n_write_err = 0, bytes_out = 0;
  std::vector<uint8_t> buf(65536 + 64);

  auto report = [&](const char* why) {
    std::fprintf(stderr,
                 "crosstrain-delay-relay: %s: dev=%s delay_ms=%g in=%llu out=%llu bytes_out=%llu lost=%llu "
                 "overflow=%llu write_errors=%llu queued=%zu flipped=%llu\n",
                 why, opt.dev.c_str(), opt.delay_ms, (unsigned long long)n_in, (unsigned long long)n_out,
                 (unsigned long long)bytes_out, (unsigned long long)n_lost, (unsigned long long)n_overflow,
                 (unsigned long long)n_write_err, queue.size(), (unsigned long long)n_flipped);
  };
  std::fprintf(stderr, "crosstrain-delay-relay: attached to %s, delay %g ms, loss %g\n", opt.dev.c_str(),
               opt.delay_ms, opt.loss);

  while (!g_stop) {
    // Forward everything that is due.
    int64_t t = now_ns();
    while (!queue.empty() && queue.front().due_ns <= t) {
      Packet& p = queue.front();
      ssize_t w = write(fd, p.bytes.data(), p.bytes.size());
      if (w < 0) ++n_write_err;  // dropped, as a failing link would
      else ++n_out, bytes_out += p.bytes.size();
      queued_bytes -= p.bytes.size();
      queue.pop_front();
    }

    // Sleep until a packet arrives, the head is due, or a signal comes.
    timespec timeout{};
    timespec* tp = nullptr;
    if (!queue.empty()) {
      int64_t wait = queue.front().due_ns - now_ns();
      if (wait < 0) wait = 0;
      timeout.tv_sec = wait / 1000000000;
      timeout.tv_nsec = wait % 1000000000;
      tp = &timeout;
    }
    pollfd pfd{fd, POLLIN, 0};
    int r = ppoll(&pfd, 1, tp, &during_poll);
    if (r < 0) {
      if (errno == EINTR) {
        if (g_stats) g_stats = 0, report("counters");
        continue;
      }
      std::fprintf(stderr, "crosstrain-delay-relay: poll: %s\n", std::strerror(errno));
      return 1;
    }
    if (r > 0 && (pfd.revents & (POLLERR | POLLHUP | POLLNVAL))) {
      std::fprintf(stderr, "crosstrain-delay-relay: the TUN device went away\n");
      break;
    }
    if (r == 0 || !(pfd.revents & POLLIN)) continue;

    // Take every packet that is waiting; each is stamped with its arrival time plus the delay.
    for (int burst = 0; burst < 1024; ++burst) {
      ssize_t n = read(fd, buf.data(), buf.size());
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) break;
        std::fprintf(stderr, "crosstrain-delay-relay: read: %s\n", std::strerror(errno));
        return 1;
      }
      if (n == 0) break;
      ++n_in;
      if (opt.loss > 0 && uniform(rng) < opt.loss) {
        ++n_lost;
        continue;
      }
      if (capture || opt.flip_every || g_armed > 0) {
        const Payload t = tcp_payload(buf.data(), size_t(n));
        const size_t data = t.end - t.begin;
        const bool every = opt.flip_every && data >= 64 && ++data_segments % opt.flip_every == 0;
        const bool armed = g_armed > 0 && data >= kBulkBytes;
        if (every || armed) {
          buf[(t.begin + t.end) / 2] ^= 0x10;
          fix_tcp_checksum(buf.data(), t);
          ++n_flipped;
          if (armed) {
            g_armed = g_armed - 1;  // signals are blocked outside ppoll(): no handler runs in between
            std::fprintf(stderr, "crosstrain-delay-relay: flipped a byte of a %zu-byte data segment (armed)\n", data);
          }
        }
        if (capture && t.end > t.begin) std::fwrite(buf.data() + t.begin, 1, t.end - t.begin, capture);
      }
      if (queued_bytes + size_t(n) > opt.max_queue_bytes) {
        ++n_overflow;  // tail drop, as a full router queue would
        continue;
      }
      queue.push_back(Packet{now_ns() + delay_ns, std::vector<uint8_t>(buf.begin(), buf.begin() + n)});
      queued_bytes += size_t(n);
    }
  }
  report("stopping");
  if (capture) std::fclose(capture);
  close(fd);
  if (!opt.pidfile.empty()) unlink(opt.pidfile.c_str());
  return 0;
}
