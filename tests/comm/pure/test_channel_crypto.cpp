// The cryptography of a sealed connection (comm/secure/channel_crypto.h): both ends derive the same keys only
// with the same secret, and a message opens only as the one sealed (key, tag, sequence number, pair, length).
#include "crosstrain/comm/secure/channel_crypto.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace crosstrain::comm::secure {
namespace {

std::vector<unsigned char> pattern(size_t n) {
  std::vector<unsigned char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(i * 131 + 7);
  return v;
}

std::vector<Cipher> ciphers() {
  std::vector<Cipher> c{Cipher::ChaCha20Poly1305};
  if (fastest_cipher() == Cipher::Aes256Gcm) c.push_back(Cipher::Aes256Gcm);
  return c;
}

TEST(ChannelCrypto, BothEndsDeriveMatchingKeysOnlyWithTheSameSecret) {
  KeyPair a, b;
  const Key s = secret_digest("the job secret");
  const ChannelKeys at_a = derive_channel_keys(a, b.public_key.data(), 0, 3, s);
  const ChannelKeys at_b = derive_channel_keys(b, a.public_key.data(), 3, 0, s);
  EXPECT_EQ(at_a.send, at_b.recv);
  EXPECT_EQ(at_a.recv, at_b.send);
  EXPECT_NE(at_a.send, at_a.recv);  // each direction has its own key
  // A peer (or someone who swapped the public keys in the path) without the secret derives other keys.
  const ChannelKeys other = derive_channel_keys(b, a.public_key.data(), 3, 0, secret_digest("another secret"));
  EXPECT_NE(at_a.send, other.recv);
  // The same pair of key pairs between other ranks: other keys (a message cannot be moved to another pair).
  EXPECT_NE(at_a.send, derive_channel_keys(a, b.public_key.data(), 0, 2, s).send);
  // Fresh key pairs per connection: fresh keys.
  KeyPair c;
  EXPECT_NE(at_a.send, derive_channel_keys(c, b.public_key.data(), 0, 3, s).send);
}

TEST(ChannelCrypto, ALowOrderPublicKeyIsRefused) {
  KeyPair a;
  const std::vector<unsigned char> zero(kPublicKeyBytes, 0);
  EXPECT_THROW(derive_channel_keys(a, zero.data(), 0, 1, secret_digest("s")), std::exception);
}

TEST(ChannelCrypto, AMessageOpensOnlyAsTheOneSealed) {
  for (Cipher cipher : ciphers()) {
    SCOPED_TRACE(to_string(cipher));
    KeyPair a, b;
    const Key s = secret_digest("secret");
    const ChannelKeys ka = derive_channel_keys(a, b.public_key.data(), 1, 2, s);
    const ChannelKeys kb = derive_channel_keys(b, a.public_key.data(), 2, 1, s);
    const Sealer send(cipher, ka.send), recv(cipher, kb.recv);
    for (size_t n : {size_t{0}, size_t{1}, size_t{15}, size_t{1000003}}) {
      const auto plain = pattern(n);
      std::vector<unsigned char> box(n + kMacBytes), out(n, 0xee);
      send.seal(plain.data(), n, box.data(), 7, 41, 1, 2);
      if (n > 0) {
        EXPECT_NE(std::vector<unsigned char>(box.begin(), box.begin() + n), plain) << "not encrypted";
      }
      ASSERT_TRUE(recv.open(box.data(), n, out.data(), 7, 41, 1, 2)) << n;
      EXPECT_EQ(out, plain);
      EXPECT_FALSE(recv.open(box.data(), n, out.data(), 7, 40, 1, 2)) << "replayed or reordered (sequence)";
      EXPECT_FALSE(recv.open(box.data(), n, out.data(), 8, 41, 1, 2)) << "moved to another tag";
      EXPECT_FALSE(recv.open(box.data(), n, out.data(), 7, 41, 0, 2)) << "claims another sender";
      if (n > 0) {
        EXPECT_FALSE(recv.open(box.data(), n - 1, out.data(), 7, 41, 1, 2)) << "cut short";
      }
      auto flipped = box;
      flipped[n / 2] ^= 0x01;  // the payload, or the tag of an empty message
      EXPECT_FALSE(recv.open(flipped.data(), n, out.data(), 7, 41, 1, 2)) << "one bit flipped";
      flipped = box;
      flipped[n + kMacBytes - 1] ^= 0x80;
      EXPECT_FALSE(recv.open(flipped.data(), n, out.data(), 7, 41, 1, 2)) << "tag changed";
      // The other direction's key does not open it either.
      const Sealer wrong(cipher, kb.send);
      EXPECT_FALSE(wrong.open(box.data(), n, out.data(), 7, 41, 1, 2));
    }
  }
}

TEST(ChannelCrypto, AMessageThatDoesNotOpenLeavesZerosNeverForgedBytes) {
  for (Cipher cipher : ciphers()) {
    SCOPED_TRACE(to_string(cipher));
    KeyPair a, b;
    const ChannelKeys k = derive_channel_keys(a, b.public_key.data(), 0, 1, secret_digest("s"));
    const Sealer s(cipher, k.send);
    const auto plain = pattern(64);
    std::vector<unsigned char> box(64 + kMacBytes), out(64, 0xee);
    s.seal(plain.data(), 64, box.data(), 1, 0, 0, 1);
    box[3] ^= 4;
    EXPECT_FALSE(s.open(box.data(), 64, out.data(), 1, 0, 0, 1));
    EXPECT_EQ(out, std::vector<unsigned char>(64, 0));
  }
}

TEST(ChannelCrypto, SecretDigestsDiffer) {
  EXPECT_NE(secret_digest("a"), secret_digest("b"));
  EXPECT_EQ(secret_digest("a"), secret_digest("a"));
}

}  // namespace
}  // namespace crosstrain::comm::secure
