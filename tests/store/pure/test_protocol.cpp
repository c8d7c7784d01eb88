// The rendezvous store's wire protocol: framing, limits and admission, without sockets.
#include <gtest/gtest.h>

#include "crosstrain/store/protocol.h"

using namespace crosstrain::comm::store;

namespace {

Message round_trip(const Message& m) {
  auto frame = encode_frame(m);
  const uint32_t size = parse_length(frame.data(), kMaxFrameBytes);
  EXPECT_EQ(size + kLengthBytes, frame.size());
  return decode_body(frame.data() + kLengthBytes, size);
}

std::vector<uint8_t> le32(uint32_t v) {
  return {uint8_t(v), uint8_t(v >> 8), uint8_t(v >> 16), uint8_t(v >> 24)};
}

}  // namespace

TEST(StoreProtocol, FramesRoundTripBinaryFields) {
  Message m{Code::CompareSet, {"key", std::string("\0\xff\n", 3), ""}};
  Message back = round_trip(m);
  EXPECT_EQ(back.code, Code::CompareSet);
  EXPECT_EQ(back.fields, m.fields);
  EXPECT_TRUE(round_trip(Message{Code::NumKeys, {}}).fields.empty());
}

TEST(StoreProtocol, OversizedLengthIsRefusedBeforeAnyAllocation) {
  // The probe that froze c10d's store: a 1 GiB length prefix.
  auto prefix = le32(1u << 30);
  EXPECT_THROW(parse_length(prefix.data(), kMaxFrameBytes), ProtocolError);
  auto small = le32(kMaxHelloBytes + 1);
  EXPECT_THROW(parse_length(small.data(), kMaxHelloBytes), ProtocolError);
  auto tiny = le32(2);
  EXPECT_THROW(parse_length(tiny.data(), kMaxFrameBytes), ProtocolError);
}

TEST(StoreProtocol, MalformedBodiesAreRejected) {
  auto frame = encode_frame(Message{Code::Set, {"k", "value"}});
  const uint8_t* body = frame.data() + kLengthBytes;
  const size_t size = frame.size() - kLengthBytes;
  EXPECT_THROW(decode_body(body, size - 1), ProtocolError);  // ends inside a field
  EXPECT_THROW(decode_body(body, 3), ProtocolError);
  std::vector<uint8_t> longer(body, body + size);
  longer.push_back(0);
  EXPECT_THROW(decode_body(longer.data(), longer.size()), ProtocolError);  // trailing bytes
  std::vector<uint8_t> many{uint8_t(Code::Check)};
  auto count = le32(kMaxFields + 1);
  many.insert(many.end(), count.begin(), count.end());
  EXPECT_THROW(decode_body(many.data(), many.size()), ProtocolError);
  std::vector<uint8_t> huge_field{uint8_t(Code::Set)};
  for (uint32_t v : {1u, 0xffffffffu}) {
    auto b = le32(v);
    huge_field.insert(huge_field.end(), b.begin(), b.end());
  }
  EXPECT_THROW(decode_body(huge_field.data(), huge_field.size()), ProtocolError);
}

TEST(StoreProtocol, PreambleNamesStrangers) {
  auto good = encode_preamble();
  EXPECT_EQ(parse_preamble(good.data()), kVersion);
  uint8_t garbage[kPreambleBytes] = {0, 0, 0, 0, 0, 0, 0, 0x40};
  EXPECT_THROW(parse_preamble(garbage), ProtocolError);
}

TEST(StoreProtocol, RequestsAreCheckedForArityAndSizes) {
  EXPECT_EQ(request_error(Message{Code::Set, {"k", "v"}}), "");
  EXPECT_NE(request_error(Message{Code::Set, {"k"}}), "");
  EXPECT_NE(request_error(Message{Code::Set, {std::string(kMaxKeyBytes + 1, 'k'), "v"}}), "");
  EXPECT_NE(request_error(Message{Code::Set, {"k", std::string(kMaxValueBytes + 1, 'v')}}), "");
  EXPECT_EQ(request_error(Message{Code::Wait, {"100", "a", "b"}}), "");
  EXPECT_NE(request_error(Message{Code::Wait, {"100"}}), "");
  EXPECT_NE(request_error(Message{Code::Hello, {}}), "");  // only as the first message
  EXPECT_NE(request_error(Message{static_cast<Code>(77), {}}), "");
}

TEST(StoreProtocol, HelloKeepsUnknownKeysForLaterVersions) {
  Hello h;
  h.rank = 3;
  h.world_size = 8;
  h.extra["token"] = "secret";
  Hello back = decode_hello(round_trip(encode_hello(h)));
  EXPECT_EQ(back.rank, 3);
  EXPECT_EQ(back.world_size, 8);
  EXPECT_EQ(back.extra.at("token"), "secret");
  EXPECT_THROW(decode_hello(Message{Code::Hello, {"rank", "1"}}), ProtocolError);  // no world size
  EXPECT_THROW(decode_hello(Message{Code::Hello, {"world_size", "two"}}), ProtocolError);
  EXPECT_THROW(decode_hello(Message{Code::Set, {"k", "v"}}), ProtocolError);
}

TEST(StoreProtocol, HelloIntegersAreRangeCheckedBeforeNarrowing) {
  // 2^32 used to be truncated to int: admitted as rank 0.
  EXPECT_THROW(decode_hello(Message{Code::Hello, {"rank", "4294967296", "world_size", "2"}}), ProtocolError);
  EXPECT_THROW(decode_hello(Message{Code::Hello, {"rank", "-2", "world_size", "2"}}), ProtocolError);
  EXPECT_THROW(decode_hello(Message{Code::Hello, {"rank", "0", "world_size", "4294967298"}}), ProtocolError);
  EXPECT_THROW(decode_hello(Message{Code::Hello, {"rank", "0", "world_size", "0"}}), ProtocolError);
  try {
    decode_hello(Message{Code::Hello, {"rank", "4294967296", "world_size", "2"}});
  } catch (const ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("rank of 4294967296 is outside -1.."), std::string::npos) << e.what();
  }
  EXPECT_EQ(decode_hello(Message{Code::Hello, {"rank", "-1", "world_size", "2"}}).rank, -1);
}

TEST(StoreProtocol, AdmissionNamesWhatMismatched) {
  Hello h;
  h.rank = 2;
  h.world_size = 4;
  EXPECT_EQ(admission_error(h, 4, {0, 1}), "");
  const std::string other_job = admission_error(h, 2, {});
  EXPECT_NE(other_job.find("job of 2 ranks"), std::string::npos) << other_job;
  EXPECT_NE(other_job.find("WORLD_SIZE=4"), std::string::npos) << other_job;
  const std::string taken = admission_error(h, 4, {2});
  EXPECT_NE(taken.find("rank 2 is already connected"), std::string::npos) << taken;
  h.rank = 9;
  h.world_size = 4;
  EXPECT_NE(admission_error(h, 4, {}).find("outside 0..3"), std::string::npos);
  h.rank = -1;  // a probe claims no rank, so it may come twice
  EXPECT_EQ(admission_error(h, 4, {0, 1, 2, 3}), "");
}
