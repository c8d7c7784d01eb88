// The wire protocol of crosstrain's rendezvous store: framing, limits and the handshake. Pure logic, no sockets.
//
// A connection opens with an 8-byte preamble ("CTRV" + protocol version, little-endian u32), then carries
// frames both ways:   u32 body length | u8 code | u32 field count | (u32 length | bytes) per field
// The first frame is the client's Hello (key/value fields: "rank", "world_size", "job", "nonce"); the server
// answers Ok or Refused with a reason, or, when the job has a secret, a Challenge that the client answers with a
// Proof before the server's Ok (carrying the server's own proof) or Refused (store_auth.h). Unknown Hello keys are ignored, so later versions can
// add keys; an incompatible change bumps kVersion (2: the job id and the challenge; 3: with a secret, every frame
// after the server's Ok is sealed, store/auth.h's SessionSealer) and the server refuses older
// clients with a readable reason. The frame layout itself never changes, so any version can read a refusal.
//
// Every size is bounded before anything is allocated: a peer that announces a 1 GiB frame is dropped after
// reading 4 bytes. Before its Hello is accepted a connection may send at most kMaxHelloBytes; a tool or probe
// (rank -1) at most kMaxProbeFrameBytes per message, a rank kMaxFrameBytes. The server grows its buffer as
// bytes arrive, so an announced size costs nothing until it is actually sent.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace crosstrain::comm::store {

constexpr uint32_t kVersion = 3;  // 2: the job id and the challenge; 3: sealed sessions (store/auth.h)
constexpr size_t kPreambleBytes = 8;
constexpr size_t kLengthBytes = 4;
constexpr size_t kMaxKeyBytes = 4 * 1024;
constexpr size_t kMaxValueBytes = size_t{64} << 20;    // one value; Gloo's addresses are tens of bytes
constexpr size_t kMaxFields = 1024;                    // keys of one wait or check
constexpr size_t kMaxHelloBytes = 4 * 1024;            // all a stranger may send before it is admitted
constexpr size_t kMaxProbeFrameBytes = 64 * 1024;      // one message of a tool or probe (rank -1)
constexpr size_t kMaxFrameBytes = 2 * kMaxValueBytes + kMaxFields * (kMaxKeyBytes + 4) + 64;  // compareSet
constexpr size_t kMaxStoreBytes = size_t{512} << 20;   // all keys and values of one store together

enum class Code : uint8_t {
  // Requests (client -> server).
  Hello = 1,       // key, value, key, value ...
  Set = 2,         // key, value
  Get = 3,         // key, wait_ms: waits up to wait_ms for the key; Ok(value) or TimedOut
  Add = 4,         // key, delta (decimal): Ok(new value, decimal)
  CompareSet = 5,  // key, expected, desired: Ok(value now stored, or current value when it differed)
  Delete = 6,      // key: Ok("1") when it existed, Ok("0") otherwise
  Check = 7,       // keys...: Ok("1") when all exist
  NumKeys = 8,     // Ok(count, decimal)
  Wait = 9,        // wait_ms, keys...: Ok or TimedOut
  Proof = 10,      // handshake: HMAC proof of the job secret (empty: this client has none)
  GetMany = 11,    // wait_ms, keys...: waits up to wait_ms for every key; Ok(their values, in order) or TimedOut
  // Replies (server -> client).
  Ok = 100,
  TimedOut = 101,
  Refused = 102,   // handshake refused: reason
  Invalid = 103,   // request broke a rule (size, arity, full store): reason; the connection stays usable
  Challenge = 104, // handshake, when the job has a secret: the server's nonce (Ok then carries its proof)
};

struct Message {
  Code code = Code::Ok;
  std::vector<std::string> fields;  // binary-safe
};

// Malformed or oversized input from a peer. The server drops the connection; the client reports it.
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::vector<uint8_t> encode_preamble(uint32_t version = kVersion);
// Returns the peer's version; throws ProtocolError when the bytes are not a crosstrain store preamble.
uint32_t parse_preamble(const uint8_t* bytes);

// The whole frame, length prefix included. Throws ProtocolError when the message exceeds kMaxFrameBytes.
std::vector<uint8_t> encode_frame(const Message& message);
// The body length announced by a 4-byte prefix; throws ProtocolError above `limit`.
uint32_t parse_length(const uint8_t* prefix, size_t limit);
// A body (without its length prefix); throws ProtocolError when it is malformed.
Message decode_body(const uint8_t* data, size_t size);

// Checks a request's arity and key/value sizes; returns "" when it is well-formed, else the reason.
std::string request_error(const Message& request);

// What a client says about itself in its Hello.
struct Hello {
  int rank = -1;        // -1: not a rank (a tool or a probe); it claims nothing
  int world_size = 0;
  std::string job;    // the job id ("" for an unnamed job); the store admits only its own job
  std::string nonce;  // the client's challenge to the server (store_auth.h); "" without a secret
  std::map<std::string, std::string> extra;  // keys this version does not know, kept for later versions
};
Message encode_hello(const Hello& hello);
Hello decode_hello(const Message& message);  // throws ProtocolError

// Why the job hosting a store refuses a client ("" when it admits it): a world size that differs (another
// job on the same port), a rank outside the job, or a rank some connected process already holds.
std::string admission_error(const Hello& hello, int world_size, const std::set<int>& ranks_taken);

// "key 'a'" or "keys 'a', 'b'" (the first few): for error messages.
std::string describe_keys(const std::vector<std::string>& keys);

// Decimal integers inside fields; throw ProtocolError on anything else.
int64_t parse_int(const std::string& text);

}  // namespace crosstrain::comm::store
