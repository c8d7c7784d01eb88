#include "bench_seal.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "crosstrain/comm/secure/channel_crypto.h"
#include "crosstrain/core/error.h"

namespace crosstrain::apps {
namespace {

using Clock = std::chrono::steady_clock;
using namespace comm::secure;

// Bytes per second of `one()` over `bytes`-long messages, repeated for about `seconds`.
template <typename Fn>
double rate(double seconds, int64_t bytes, Fn one) {
  int64_t done = 0;
  const auto start = Clock::now();
  double elapsed = 0;
  do {
    for (int i = 0; i < 8; ++i) one(static_cast<uint64_t>(done + i));
    done += 8;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } while (elapsed < seconds);
  return static_cast<double>(done) * static_cast<double>(bytes) / elapsed;
}

}  // namespace

int bench_seal(const BenchSealOptions& o) {
  if (o.message_bytes < 1 || o.message_bytes > (1LL << 30)) throw UsageError("--bytes must be between 1 and 1G");
  const KeyPair a, b;
  const ChannelKeys k = derive_channel_keys(a, b.public_key.data(), 0, 1, secret_digest("bench"));
  const size_t n = static_cast<size_t>(o.message_bytes);
  std::vector<unsigned char> plain(n, 0x5a), box(n + kMacBytes), out(n);
  std::printf("# crosstrain bench seal: one core, %zu-byte messages\n#%18s %12s %12s\n", n, "cipher", "seal GB/s",
              "open GB/s");
  const Cipher chosen = fastest_cipher();
  double chosen_rate = 0;
  for (Cipher c : {Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305}) {
    if (c == Cipher::Aes256Gcm && chosen != Cipher::Aes256Gcm) {
      std::printf("%19s %12s %12s\n", to_string(c), "n/a", "n/a");  // no AES-NI
      continue;
    }
    const Sealer sealer(c, k.send);
    const double seal = rate(o.seconds, o.message_bytes, [&](uint64_t i) {
      sealer.seal(plain.data(), n, box.data(), 1, i, 0, 1);
    });
    sealer.seal(plain.data(), n, box.data(), 1, 0, 0, 1);
    bool ok = true;
    const double open = rate(o.seconds, o.message_bytes, [&](uint64_t) {
      ok &= sealer.open(box.data(), n, out.data(), 1, 0, 0, 1);
    });
    if (!ok || out != plain) throw Error(std::string("bench seal: ") + to_string(c) + " did not open its own message");
    std::printf("%19s %12.2f %12.2f\n", to_string(c), seal / 1e9, open / 1e9);
    if (c == chosen) chosen_rate = std::min(seal, open);
  }
  std::printf("cipher=%s aead_GBps_per_core=%.2f\n", to_string(chosen), chosen_rate / 1e9);
  return 0;
}

}  // namespace crosstrain::apps
