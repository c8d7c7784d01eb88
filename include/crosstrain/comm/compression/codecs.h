// Gradient compression: pluggable codecs, error feedback, and an all-reduce that moves compressed payloads.
//
// A codec turns a contiguous float32 buffer into a payload (a few small tensors) and back. Codecs are pure
// functions of their input, except PowerSGD, which keeps one warm-start matrix per buffer id (state that every
// rank holds identically). Spec strings (`comm.compression`):
//
//   none          the float32 buffer itself
//   bf16, fp16    a cast; relative error <= 2^-8 (bf16), <= 2^-11 (fp16; |x| > 65504 becomes inf)
//   int8, int4    blockwise symmetric quantization: blocks of 256 elements, one float32 scale per block,
//                 scale = max|x| / 127 (int8) or / 7 (int4), q = round-to-nearest-even(x / scale); int4 packs two
//                 values per byte. Error bound per element: |x - decode(encode(x))| <= scale / 2 of its block
//                 (plus float32 rounding of the division and the product, a few ulps of |x|).
//                 A block holding inf or NaN decodes to NaN: a non-finite gradient stays visible.
//   topk:F        the ceil(F * n) largest-magnitude entries (0 < F <= 1), as int32 indices plus float32 values;
//                 the others decode to 0.
//   powersgd:R    rank-R approximation of the buffer viewed as a near-square [rows, cols] matrix M (zero-padded):
//                 P = M Q, orthonormalize P, Q = M^T P, M ~ P Q^T; Q is warm-started from the previous step of
//                 the same buffer id, and starts from a seeded generator, so every rank starts alike.
//                 Error: ||x - decode||_2 <= ||x||_2 (an orthogonal projection); the warm start makes repeated
//                 steps on similar buffers converge to the best rank-R approximation.
//
// compressed_all_reduce() averages a buffer over a group through a codec; every rank ends with bit-identical
// values. Each kind of codec moves its payload differently (see Exchange). Bytes are counted per rank as the
// bandwidth-optimal algorithm of each collective sends them (the nccl-tests busbw factors), for payload bytes S
// of the whole group's data: all-reduce 2(n-1)/n * S; all-gather and all-to-all (n-1)/n * S. The reference
// is the plain float32 all-reduce of the same buffer: 2(n-1)/n * 4 * numel. A world of one sends nothing.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "crosstrain/comm/communicator.h"

namespace crosstrain::comm {

// What a codec produces for one buffer. The layout (dtypes and numels of the parts) depends only on the
// buffer's numel, so ranks can exchange payloads in fixed-size slices.
struct Payload {
  std::vector<at::Tensor> parts;
  int64_t bytes() const;
};

// How compressed_all_reduce moves a codec's payload.
enum class Exchange {
  // Plain float32 all-reduce (avg) of the buffer.
  AllReduce,
  // Elementwise codecs (casts, blockwise quantization): the buffer is cut into one chunk per rank; an all-to-all
  // sends each chunk, encoded, to its owner; the owner decodes the n encodings, sums them in float32 in rank order
  // and divides by n, encodes the average and an all-gather brings every encoded chunk of the average to every
  // rank, which decodes them. Two encodings on the way (the input, then the average); 2(n-1)/n of the payload
  // sent, like a ring all-reduce, whatever the world size. Low-precision values are never summed.
  // Error against the true average, per element: casts <= u (mean_i |x_i| + |average|) with u their unit roundoff;
  // quantization <= the mean over ranks of the element's block scale (s_i / 2 from each input, then half the
  // average's own scale, which is at most the mean of the s_i).
  ReduceScatterAllGather,
  // Sparse codecs (top-k): every rank's payload is all-gathered; every rank decodes them and sums in float32 in
  // rank order, then divides by n. (n-1) payloads sent, so the saving shrinks as the world grows (topk:0.01 is
  // 50x at 2 ranks, 25x at 4). The result is exactly the average of the ranks' kept entries.
  AllGather,
  // PowerSGD: all-reduce (avg) of P, orthonormalize, all-reduce (avg) of Q; the result is P Q^T.
  LowRank,
};

class Codec {
 public:
  virtual ~Codec() = default;
  // The canonical spec, e.g. "int8" or "topk:0.01".
  virtual std::string name() const = 0;
  virtual Exchange exchange() const = 0;
  // `x`: contiguous float32, any shape, read as flat. `buffer_id` selects per-buffer state (PowerSGD only).
  virtual Payload encode(const at::Tensor& x, int64_t buffer_id = 0) = 0;
  // A new flat float32 tensor of `numel` elements.
  virtual at::Tensor decode(const Payload& payload, int64_t numel) const = 0;
  // Bytes of encode()'s payload for a buffer of `numel` elements.
  virtual int64_t payload_bytes(int64_t numel) const = 0;
  // Chunks of an elementwise exchange start at multiples of this many elements (a quantization block).
  virtual int64_t alignment() const { return 1; }
};

class IdentityCodec : public Codec {
 public:
  std::string name() const override { return "none"; }
  Exchange exchange() const override { return Exchange::AllReduce; }
  Payload encode(const at::Tensor& x, int64_t buffer_id = 0) override;
  at::Tensor decode(const Payload& payload, int64_t numel) const override;
  int64_t payload_bytes(int64_t numel) const override { return 4 * numel; }
};

// bf16 or fp16, rounded to nearest even.
class CastCodec : public Codec {
 public:
  explicit CastCodec(at::ScalarType dtype);
  std::string name() const override;
  Exchange exchange() const override { return Exchange::ReduceScatterAllGather; }
  Payload encode(const at::Tensor& x, int64_t buffer_id = 0) override;
  at::Tensor decode(const Payload& payload, int64_t numel) const override;
  int64_t payload_bytes(int64_t numel) const override { return 2 * numel; }

 private:
  at::ScalarType dtype_;
};

// Blockwise symmetric quantization to `bits` = 8 or 4. Payload: {codes (int8, or uint8 holding two offset
// nibbles, element 2i in the low nibble), scales (float32, one per block)}.
class QuantizeCodec : public Codec {
 public:
  static constexpr int64_t kDefaultBlock = 256;
  explicit QuantizeCodec(int bits, int64_t block = kDefaultBlock);
  std::string name() const override;
  Exchange exchange() const override { return Exchange::ReduceScatterAllGather; }
  Payload encode(const at::Tensor& x, int64_t buffer_id = 0) override;
  at::Tensor decode(const Payload& payload, int64_t numel) const override;
  int64_t payload_bytes(int64_t numel) const override;
  int64_t alignment() const override { return block_; }
  int bits() const { return bits_; }
  int64_t block() const { return block_; }
  // Largest code: 127 for int8, 7 for int4.
  int levels() const { return bits_ == 8 ? 127 : 7; }
  // The scale of each block of `x` (what encode stores): the error bound of an element is half of its block's.
  at::Tensor scales(const at::Tensor& x) const;

 private:
  int bits_;
  int64_t block_;
};

// Payload: {indices (int32, ascending), values (float32)}.
class TopKCodec : public Codec {
 public:
  explicit TopKCodec(double fraction);
  std::string name() const override;
  Exchange exchange() const override { return Exchange::AllGather; }
  Payload encode(const at::Tensor& x, int64_t buffer_id = 0) override;
  at::Tensor decode(const Payload& payload, int64_t numel) const override;
  int64_t payload_bytes(int64_t numel) const override { return 8 * kept(numel); }
  double fraction() const { return fraction_; }
  // ceil(fraction * numel), with a relative tolerance of 1e-12 so that 0.07 * 100 keeps 7, not 8.
  int64_t kept(int64_t numel) const;

 private:
  double fraction_;
};

// Payload: {P [rows, r] with orthonormal columns, Q [cols, r]}, r = min(rank, rows, cols).
class PowerSgdCodec : public Codec {
 public:
  explicit PowerSgdCodec(int64_t rank, uint64_t seed = 0x5eed);
  std::string name() const override;
  Exchange exchange() const override { return Exchange::LowRank; }
  // One power-iteration step on this rank alone; remembers Q for the next call with the same buffer id.
  Payload encode(const at::Tensor& x, int64_t buffer_id = 0) override;
  at::Tensor decode(const Payload& payload, int64_t numel) const override;
  int64_t payload_bytes(int64_t numel) const override;
  int64_t rank() const { return rank_; }

  // The matrix view of a buffer of `numel` elements: rows = ceil(sqrt(numel)), cols = ceil(numel / rows).
  static std::pair<int64_t, int64_t> shape(int64_t numel);
  // The buffer as a zero-padded [rows, cols] matrix (a copy).
  static at::Tensor to_matrix(const at::Tensor& x);
  // The steps of encode(), for compressed_all_reduce to average P and Q between them.
  at::Tensor project(const at::Tensor& matrix, int64_t buffer_id);  // P = M Q_prev
  static void orthonormalize(at::Tensor& p);                           // columns of P, in place
  void remember(int64_t buffer_id, const at::Tensor& q);               // warm start of the next step

 private:
  at::Tensor warm_q(int64_t buffer_id, int64_t cols, int64_t r);

  int64_t rank_;
  uint64_t seed_;
  std::map<int64_t, at::Tensor> q_;
};

// Parses a spec ("none", "bf16", "fp16", "int8", "int4", "topk:0.01", "powersgd:4"); throws UsageError listing the
// valid forms.
std::unique_ptr<Codec> make_codec(const std::string& spec);

// Error feedback: what compression dropped on one step is added to the next step's input, per buffer id.
// With c = x + residual: residual' = c - sent, where sent is what went out on this rank's behalf, so over any
// number of steps the inputs add up to everything sent plus the last residual (up to float32 rounding; exactly
// when c - sent is exact, as for casts, quantization and top-k).
class ErrorFeedback {
 public:
  // Whose residual: this rank's input, or (elementwise exchange) the chunk of the average this rank owns.
  enum class Stage { Input, OwnedAverage };

  // x + residual as a new tensor (a copy of x when there is none yet). Throws UsageError when the buffer id
  // had another numel before.
  at::Tensor corrected(const at::Tensor& x, int64_t buffer_id, Stage stage = Stage::Input) const;
  // residual = corrected - sent.
  void record(const at::Tensor& corrected, const at::Tensor& sent, int64_t buffer_id, Stage stage = Stage::Input);
  // Local round trip: c = corrected(x); payload = codec.encode(c); residual = c - codec.decode(payload).
  Payload encode(Codec& codec, const at::Tensor& x, int64_t buffer_id);
  // The residual (flat float32), or an undefined tensor when there is none.
  at::Tensor residual(int64_t buffer_id, Stage stage = Stage::Input) const;
  void reset() { residuals_.clear(); }

 private:
  std::map<std::pair<int64_t, Stage>, at::Tensor> residuals_;
};

struct CompressedAllReduceStats {
  int64_t bytes_sent = 0;          // by this rank, counted as in the header comment
  int64_t bytes_uncompressed = 0;  // the float32 all-reduce of the same buffer: 2(n-1)/n * 4 * numel
  // bytes_uncompressed / bytes_sent; 1 when nothing is sent.
  double ratio() const;
};

// Averages `buffer` (contiguous float32) over the ranks of `comm` in place, through `codec`; synchronous. A
// collective: every member calls it with the same numel, codec spec and buffer id. With `feedback`, each rank's
// compression error (and the error of each chunk of the average it owns) is carried to the next call with the
// same buffer id. Every rank ends with bit-identical values.
CompressedAllReduceStats compressed_all_reduce(Communicator& comm, at::Tensor& buffer, Codec& codec,
                                               ErrorFeedback* feedback, int64_t buffer_id);

}  // namespace crosstrain::comm
