// The cryptography of an encrypted connection between two ranks (comm/secure/encryption.h uses it), free of
// communication so that every property is tested on its own.
//
// A connection's keys: each rank makes a fresh X25519 key pair for every group it joins (KeyPair), the two public
// keys are exchanged in the clear, and each side derives the same two directional keys (derive_channel_keys):
// libsodium's crypto_kx session keys of the two public keys, each hashed with the job secret and the two ranks
// (BLAKE2b keyed by a digest of the secret). Someone in the path who swaps the public keys does not hold the
// secret, so the keys they derive differ from both ends' and the first message fails to open; a recorded
// connection stays sealed after the ephemeral keys are gone (forward secrecy).
//
// A message: AES-256-GCM where the CPU has AES-NI on every rank (OpenSSL's code, which uses VAES where the CPU has
// it), else ChaCha20-Poly1305 (IETF, libsodium), with the 16-byte tag after the ciphertext. The 12-byte nonce is the message tag (4 bytes) and its
// sequence number on that tag (8 bytes): each direction of a connection counts the messages of each tag, so a
// replayed, reordered, dropped-then-skipped or truncated message does not open (the receiver expects another
// number or length), and a nonce never repeats under a key. The associated data binds sender, receiver and length.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace crosstrain::comm::secure {

enum class Cipher { Aes256Gcm, ChaCha20Poly1305 };
const char* to_string(Cipher c);
// The faster cipher this CPU runs: AES-256-GCM needs AES-NI and PCLMUL.
Cipher fastest_cipher();

constexpr size_t kKeyBytes = 32;
constexpr size_t kPublicKeyBytes = 32;
constexpr size_t kMacBytes = 16;  // added to every message
using Key = std::array<unsigned char, kKeyBytes>;

// A fresh X25519 key pair (libsodium's CSPRNG); the secret half is wiped when the pair is destroyed.
struct KeyPair {
  KeyPair();
  ~KeyPair();
  KeyPair(const KeyPair&) = delete;
  KeyPair& operator=(const KeyPair&) = delete;
  std::array<unsigned char, kPublicKeyBytes> public_key{};
  std::array<unsigned char, 32> secret_key{};
};

// The key of the job secret that every channel key is hashed with; differs for every non-empty secret.
Key secret_digest(const std::string& secret);

struct ChannelKeys {
  Key send{}, recv{};  // mine.send == theirs.recv and mine.recv == theirs.send when both derive from the same secret
};
// Both ends call this with their own pair, the other's public key and the same secret digest. Throws Error when
// the peer's public key is unusable (a low-order point: someone sent garbage).
ChannelKeys derive_channel_keys(const KeyPair& mine, const unsigned char* their_public_key, int my_rank,
                                int their_rank, const Key& secret);

// Cluster identities (comm.identity, comm.peer_keys): a rank signs its group key pair's public half with its
// cluster's Ed25519 key (the ledger's, `crosstrain keys create`), and every peer checks the signature against the
// public key it holds for that cluster. A key swapped on the path then fails the check even without a job secret.
constexpr size_t kSignatureBytes = 64;
using Signature = std::array<unsigned char, kSignatureBytes>;
Signature sign_group_key(const unsigned char* ed25519_secret_key, int rank, const unsigned char* group_public_key);
bool group_key_signed_by(const unsigned char* ed25519_public_key, int rank, const unsigned char* group_public_key,
                         const Signature& signature);

// One direction of a connection: seals (sender) or opens (receiver) messages with one key. Thread-safe for
// concurrent seal/open calls (the key state is read-only after construction).
class Sealer {
 public:
  Sealer(Cipher cipher, const Key& key);
  ~Sealer();
  Sealer(const Sealer&) = delete;
  Sealer& operator=(const Sealer&) = delete;

  // Writes `bytes` + kMacBytes to `out` (which must not overlap `in`).
  void seal(const void* in, size_t bytes, unsigned char* out, uint32_t tag, uint64_t sequence, int from,
            int to) const;
  // Opens `bytes` + kMacBytes of `in` into `out` (`bytes` long); false when the message is not the one sealed
  // with this key, tag, sequence number, sender, receiver and length, and then `out` holds zeros (libsodium
  // clears it), never bytes of a forged message.
  bool open(const unsigned char* in, size_t bytes, void* out, uint32_t tag, uint64_t sequence, int from,
            int to) const;
  Cipher cipher() const { return cipher_; }

 private:
  Cipher cipher_;
  Key key_;
};

}  // namespace crosstrain::comm::secure
