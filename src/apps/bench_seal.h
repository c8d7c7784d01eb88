// `crosstrain bench seal`: how fast one core seals and opens messages with each cipher of the sealed data plane
// (comm/secure/channel_crypto.h), in messages of the ring's piece size. Prints a table and
// `aead_GBps_per_core=` (the cipher the ranks would choose on this CPU, the slower of sealing and opening).
#pragma once

#include <cstdint>

namespace crosstrain::apps {

struct BenchSealOptions {
  int64_t message_bytes = 1 << 20;  // the ring all-reduce's pieces are at most 1 MiB
  double seconds = 0.5;             // per cipher and direction
};

int bench_seal(const BenchSealOptions& options);

}  // namespace crosstrain::apps
