#include "crosstrain/store/protocol.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <limits>

namespace crosstrain::comm::store {

namespace {

constexpr char kMagic[4] = {'C', 'T', 'R', 'V'};

// Little-endian on the wire whatever the host, so mixed machines agree.
void put_u32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

uint32_t get_u32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

size_t body_size(const Message& m) {
  size_t n = 1 + 4;
  for (const auto& f : m.fields) n += 4 + f.size();
  return n;
}

std::string too_long(const char* what, size_t size, size_t limit) {
  return std::string(what) + " of " + std::to_string(size) + " bytes is over the limit of " + std::to_string(limit);
}

// A Hello's integer, range-checked before it narrows to int: a rank of 2^32 must not be admitted as rank 0.
int parse_int_in(const std::string& text, const char* what, int lowest) {
  const int64_t v = parse_int(text);
  if (v < lowest || v > std::numeric_limits<int>::max())
    throw ProtocolError(std::string("a hello's ") + what + " of " + text + " is outside " + std::to_string(lowest) +
                        ".." + std::to_string(std::numeric_limits<int>::max()));
  return static_cast<int>(v);
}

}  // namespace

std::vector<uint8_t> encode_preamble(uint32_t version) {
  std::vector<uint8_t> out(kMagic, kMagic + 4);
  put_u32(out, version);
  return out;
}

uint32_t parse_preamble(const uint8_t* bytes) {
  if (std::memcmp(bytes, kMagic, 4) != 0) throw ProtocolError("not a crosstrain store client (wrong preamble)");
  return get_u32(bytes + 4);
}

std::vector<uint8_t> encode_frame(const Message& message) {
  const size_t size = body_size(message);
  if (size > kMaxFrameBytes) throw ProtocolError(too_long("a store message", size, kMaxFrameBytes));
  std::vector<uint8_t> out;
  out.reserve(kLengthBytes + size);
  put_u32(out, static_cast<uint32_t>(size));
  out.push_back(static_cast<uint8_t>(message.code));
  put_u32(out, static_cast<uint32_t>(message.fields.size()));
  for (const auto& f : message.fields) {
    put_u32(out, static_cast<uint32_t>(f.size()));
    out.insert(out.end(), f.begin(), f.end());
  }
  return out;
}

uint32_t parse_length(const uint8_t* prefix, size_t limit) {
  const uint32_t size = get_u32(prefix);
  if (size > limit) throw ProtocolError(too_long("a store message", size, limit));
  if (size < 5) throw ProtocolError("a store message of " + std::to_string(size) + " bytes is too short");
  return size;
}

Message decode_body(const uint8_t* data, size_t size) {
  if (size < 5) throw ProtocolError("a store message of " + std::to_string(size) + " bytes is too short");
  Message m;
  m.code = static_cast<Code>(data[0]);
  const uint32_t count = get_u32(data + 1);
  if (count > kMaxFields) throw ProtocolError(too_long("a field count", count, kMaxFields));
  size_t at = 5;
  m.fields.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    if (size - at < 4) throw ProtocolError("a store message ends inside a field length");
    const uint32_t n = get_u32(data + at);
    at += 4;
    if (n > size - at) throw ProtocolError("a store message ends inside a field");
    m.fields.emplace_back(reinterpret_cast<const char*>(data + at), n);
    at += n;
  }
  if (at != size) throw ProtocolError("a store message has " + std::to_string(size - at) + " bytes after its fields");
  return m;
}

std::string request_error(const Message& r) {
  auto arity = [&](size_t n) { return r.fields.size() == n; };
  bool ok = true;
  size_t first_key = 0, last_key = 1;  // [first_key, last_key): the fields that are keys
  switch (r.code) {
    case Code::Set: ok = arity(2); break;
    case Code::Get: ok = arity(2); break;
    case Code::Add: ok = arity(2); break;
    case Code::CompareSet: ok = arity(3); break;
    case Code::Delete: ok = arity(1); break;
    case Code::Check: ok = !r.fields.empty(); last_key = r.fields.size(); break;
    case Code::NumKeys: ok = arity(0); last_key = 0; break;
    case Code::Wait:
    case Code::GetMany: ok = r.fields.size() >= 2; first_key = 1; last_key = r.fields.size(); break;
    default: return "unknown request code " + std::to_string(static_cast<int>(r.code));
  }
  if (!ok) return "wrong number of fields (" + std::to_string(r.fields.size()) + ") for request code " +
                  std::to_string(static_cast<int>(r.code));
  for (size_t i = first_key; i < last_key; ++i)
    if (r.fields[i].size() > kMaxKeyBytes) return too_long("a key", r.fields[i].size(), kMaxKeyBytes);
  for (size_t i = last_key; i < r.fields.size(); ++i)
    if (r.fields[i].size() > kMaxValueBytes) return too_long("a value", r.fields[i].size(), kMaxValueBytes);
  return "";
}

std::string describe_keys(const std::vector<std::string>& keys) {
  std::string out = keys.size() == 1 ? "key " : "keys ";
  for (size_t i = 0; i < keys.size() && i < 4; ++i) out += (i ? ", '" : "'") + keys[i].substr(0, 200) + "'";
  if (keys.size() > 4) out += " and " + std::to_string(keys.size() - 4) + " more";
  return out;
}

int64_t parse_int(const std::string& text) {
  if (text.empty() || text.size() > 20) throw ProtocolError("'" + text.substr(0, 32) + "' is not an integer");
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size()) throw ProtocolError("'" + text + "' is not an integer");
  return v;
}

Message encode_hello(const Hello& hello) {
  Message m{Code::Hello, {"rank", std::to_string(hello.rank), "world_size", std::to_string(hello.world_size)}};
  if (!hello.job.empty()) m.fields.insert(m.fields.end(), {"job", hello.job});
  if (!hello.nonce.empty()) m.fields.insert(m.fields.end(), {"nonce", hello.nonce});
  for (const auto& [k, v] : hello.extra) {
    m.fields.push_back(k);
    m.fields.push_back(v);
  }
  return m;
}

Hello decode_hello(const Message& m) {
  if (m.code != Code::Hello) throw ProtocolError("the first message was not a hello");
  if (m.fields.size() % 2 != 0) throw ProtocolError("a hello needs key/value pairs");
  Hello h;
  bool has_world = false;
  for (size_t i = 0; i < m.fields.size(); i += 2) {
    const std::string& key = m.fields[i];
    const std::string& value = m.fields[i + 1];
    if (key == "rank") {
      h.rank = parse_int_in(value, "rank", -1);
    } else if (key == "world_size") {
      h.world_size = parse_int_in(value, "world_size", 1);
      has_world = true;
    } else if (key == "job") {
      h.job = value;
    } else if (key == "nonce") {
      h.nonce = value;
    } else {
      h.extra[key] = value;
    }
  }
  if (!has_world) throw ProtocolError("a hello must say its world size");
  return h;
}

std::string admission_error(const Hello& hello, int world_size, const std::set<int>& ranks_taken) {
  const std::string who = hello.rank >= 0 ? "rank " + std::to_string(hello.rank) : "a client";
  if (hello.world_size != world_size)
    return "this store belongs to a job of " + std::to_string(world_size) + " ranks, but " + who +
           " was started with WORLD_SIZE=" + std::to_string(hello.world_size) +
           " (is another job using this port, or a launcher given other --nproc/--nnodes?)";
  if (hello.rank < -1 || hello.rank >= world_size)
    return "rank " + std::to_string(hello.rank) + " is outside 0.." + std::to_string(world_size - 1) +
           " of this job of " + std::to_string(world_size) + " ranks";
  if (hello.rank >= 0 && ranks_taken.count(hello.rank))
    return "rank " + std::to_string(hello.rank) + " is already connected to this store (two processes with RANK=" +
           std::to_string(hello.rank) + ", or another job using this port?)";
  return "";
}

}  // namespace crosstrain::comm::store
