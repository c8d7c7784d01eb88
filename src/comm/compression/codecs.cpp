#include "crosstrain/comm/compression/codecs.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "crosstrain/core/error.h"

namespace crosstrain::comm {
namespace {

const char* kValidSpecs =
    "none, bf16, fp16, int8, int4, topk:F (0 < F <= 1, e.g. topk:0.01), powersgd:R (R >= 1, e.g. powersgd:4)";

at::TensorOptions float_options() { return at::TensorOptions().dtype(at::kFloat); }

// The input of a codec as a flat float32 view; throws UsageError for anything else.
at::Tensor flat_input(const at::Tensor& x, const char* who) {
  if (!x.defined() || x.scalar_type() != at::kFloat || !x.is_contiguous() || x.device().type() != at::kCPU)
    throw UsageError(std::string(who) + ": expected a contiguous float32 CPU tensor, got " +
                     (x.defined() ? std::string(x.toString()) + (x.is_contiguous() ? "" : " (not contiguous)")
                                  : std::string("an undefined tensor")));
  return x.view({-1});
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Bytes each rank sends in the bandwidth-optimal algorithm of each collective (nccl-tests' busbw factors).
int64_t all_reduce_bytes(int64_t bytes, int n) { return n <= 1 ? 0 : (2 * (n - 1) * bytes + n / 2) / n; }
int64_t all_gather_bytes(int64_t per_rank_bytes, int n) { return (n - 1) * per_rank_bytes; }

// A payload with the layout of `like` read from slice `index` of flat buffers holding one slice per rank.
Payload slice_payload(const std::vector<at::Tensor>& flats, const Payload& like, int64_t index) {
  Payload p;
  for (size_t i = 0; i < flats.size(); ++i) {
    const int64_t n = like.parts[i].numel();
    p.parts.push_back(flats[i].narrow(0, index * n, n).view(like.parts[i].sizes()));
  }
  return p;
}

}  // namespace

int64_t Payload::bytes() const {
  int64_t total = 0;
  for (const auto& t : parts) total += t.numel() * static_cast<int64_t>(t.element_size());
  return total;
}

// --- none -----------------------------------------------------------------------------------------------

Payload IdentityCodec::encode(const at::Tensor& x, int64_t) { return {{flat_input(x, "none.encode").clone()}}; }

at::Tensor IdentityCodec::decode(const Payload& payload, int64_t numel) const {
  return payload.parts.at(0).reshape({numel}).clone();
}

// --- bf16, fp16 -----------------------------------------------------------------------------------------

CastCodec::CastCodec(at::ScalarType dtype) : dtype_(dtype) {
  if (dtype != at::kBFloat16 && dtype != at::kHalf) throw UsageError("CastCodec: dtype must be bfloat16 or half");
}

std::string CastCodec::name() const { return dtype_ == at::kBFloat16 ? "bf16" : "fp16"; }

Payload CastCodec::encode(const at::Tensor& x, int64_t) { return {{flat_input(x, "cast.encode").to(dtype_)}}; }

at::Tensor CastCodec::decode(const Payload& payload, int64_t numel) const {
  return payload.parts.at(0).reshape({numel}).to(at::kFloat);
}

// --- int8, int4 -----------------------------------------------------------------------------------------

QuantizeCodec::QuantizeCodec(int bits, int64_t block) : bits_(bits), block_(block) {
  if (bits != 8 && bits != 4) throw UsageError("QuantizeCodec: bits must be 8 or 4");
  if (block < 2 || block % 2 != 0) throw UsageError("QuantizeCodec: the block must be an even number >= 2");
}

std::string QuantizeCodec::name() const { return bits_ == 8 ? "int8" : "int4"; }

int64_t QuantizeCodec::payload_bytes(int64_t numel) const {
  const int64_t codes = bits_ == 8 ? numel : ceil_div(numel, 2);
  return codes + 4 * ceil_div(numel, block_);
}

at::Tensor QuantizeCodec::scales(const at::Tensor& x) const {
  at::Tensor flat = flat_input(x, "quantize.scales");
  const int64_t numel = flat.numel(), blocks = ceil_div(numel, block_);
  if (numel == 0) return at::empty({0}, float_options());
  at::Tensor padded = at::constant_pad_nd(flat, {0, blocks * block_ - numel});
  // amax propagates NaN, and inf / levels stays inf: both mark the block non-finite.
  return padded.view({blocks, block_}).abs().amax(1).div_(static_cast<double>(levels()));
}

Payload QuantizeCodec::encode(const at::Tensor& x, int64_t) {
  at::Tensor flat = flat_input(x, "quantize.encode");
  const int64_t numel = flat.numel(), blocks = ceil_div(numel, block_);
  at::Tensor scale = scales(flat);
  at::Tensor finite = at::isfinite(scale);
  at::Tensor divisor = at::where(at::logical_and(finite, scale.gt(0)), scale, at::ones_like(scale));
  at::Tensor padded = at::constant_pad_nd(flat, {0, blocks * block_ - numel}).view({blocks, block_});
  at::Tensor q = at::round(padded / divisor.unsqueeze(1)).clamp_(-levels(), levels());
  q = at::where(finite.unsqueeze(1), q, at::zeros_like(q)).view({-1}).narrow(0, 0, numel);
  // A non-finite block decodes to NaN whatever its codes.
  at::Tensor stored = at::where(finite, scale, at::full_like(scale, std::numeric_limits<float>::quiet_NaN()));
  if (bits_ == 8) return {{q.to(at::kChar), stored}};
  // int4: offset codes 1..15 (8 is zero), two per byte, element 2i in the low nibble.
  at::Tensor u = at::constant_pad_nd(q.add(8), {0, numel % 2}, 8).to(at::kShort).view({-1, 2});
  at::Tensor packed = u.select(1, 0).add(u.select(1, 1).mul(16)).to(at::kByte);
  return {{packed, stored}};
}

at::Tensor QuantizeCodec::decode(const Payload& payload, int64_t numel) const {
  const int64_t blocks = ceil_div(numel, block_);
  const at::Tensor& codes = payload.parts.at(0);
  const at::Tensor& scale = payload.parts.at(1);
  at::Tensor q;
  if (bits_ == 8) {
    q = codes.reshape({-1}).to(at::kFloat);
  } else {
    at::Tensor p = codes.reshape({-1}).to(at::kShort);
    at::Tensor hi = at::div(p, 16, "floor");
    at::Tensor lo = p - hi * 16;
    q = at::stack({lo, hi}, 1).view({-1}).narrow(0, 0, numel).to(at::kFloat).sub_(8);
  }
  at::Tensor padded = at::constant_pad_nd(q, {0, blocks * block_ - numel}).view({blocks, block_});
  return padded.mul_(scale.reshape({blocks, 1})).view({-1}).narrow(0, 0, numel).contiguous();
}

// --- topk -----------------------------------------------------------------------------------------------

TopKCodec::TopKCodec(double fraction) : fraction_(fraction) {
  if (!(fraction > 0 && fraction <= 1)) throw UsageError("TopKCodec: the fraction must be in (0, 1]");
}

std::string TopKCodec::name() const {
  char text[32];
  std::snprintf(text, sizeof text, "topk:%g", fraction_);
  return text;
}

int64_t TopKCodec::kept(int64_t numel) const {
  if (numel == 0) return 0;
  const auto k = static_cast<int64_t>(std::ceil(fraction_ * static_cast<double>(numel) * (1 - 1e-12)));
  return std::min(numel, std::max<int64_t>(1, k));
}

Payload TopKCodec::encode(const at::Tensor& x, int64_t) {
  at::Tensor flat = flat_input(x, "topk.encode");
  if (flat.numel() > std::numeric_limits<int32_t>::max())
    throw UsageError("topk: buffers above 2^31 elements are not supported; use smaller buckets");
  const int64_t k = kept(flat.numel());
  at::Tensor index = std::get<1>(at::topk(flat.abs(), k, 0, /*largest=*/true, /*sorted=*/false));
  index = std::get<0>(at::sort(index));
  return {{index.to(at::kInt), flat.index_select(0, index)}};
}

at::Tensor TopKCodec::decode(const Payload& payload, int64_t numel) const {
  at::Tensor out = at::zeros({numel}, float_options());
  out.index_copy_(0, payload.parts.at(0).reshape({-1}).to(at::kLong), payload.parts.at(1).reshape({-1}));
  return out;
}

// --- powersgd -------------------------------------------------------------------------------------------

PowerSgdCodec::PowerSgdCodec(int64_t rank, uint64_t seed) : rank_(rank), seed_(seed) {
  if (rank < 1) throw UsageError("PowerSgdCodec: the rank must be >= 1");
}

std::string PowerSgdCodec::name() const { return "powersgd:" + std::to_string(rank_); }

std::pair<int64_t, int64_t> PowerSgdCodec::shape(int64_t numel) {
  if (numel == 0) return {0, 0};
  auto rows = static_cast<int64_t>(std::sqrt(static_cast<double>(numel)));
  while (rows * rows < numel) ++rows;
  while (rows > 1 && (rows - 1) * (rows - 1) >= numel) --rows;
  return {rows, ceil_div(numel, rows)};
}

int64_t PowerSgdCodec::payload_bytes(int64_t numel) const {
  auto [rows, cols] = shape(numel);
  return 4 * std::min({rank_, rows, cols}) * (rows + cols);
}

at::Tensor PowerSgdCodec::to_matrix(const at::Tensor& x) {
  at::Tensor flat = flat_input(x, "powersgd");
  auto [rows, cols] = shape(flat.numel());
  return at::constant_pad_nd(flat, {0, rows * cols - flat.numel()}).view({rows, cols});
}

at::Tensor PowerSgdCodec::warm_q(int64_t buffer_id, int64_t cols, int64_t r) {
  auto it = q_.find(buffer_id);
  if (it != q_.end() && it->second.size(0) == cols && it->second.size(1) == r) return it->second;
  // Same seed on every rank: the first step of every buffer starts from the same Q everywhere.
  at::Generator gen = at::detail::createCPUGenerator(seed_ + 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(buffer_id));
  return at::randn({cols, r}, gen, float_options());
}

at::Tensor PowerSgdCodec::project(const at::Tensor& matrix, int64_t buffer_id) {
  const int64_t rows = matrix.size(0), cols = matrix.size(1);
  return at::mm(matrix, warm_q(buffer_id, cols, std::min({rank_, rows, cols})));
}

void PowerSgdCodec::orthonormalize(at::Tensor& p) {
  if (p.numel() == 0) return;
  // Householder QR: orthonormal columns even when P is rank-deficient (a zero gradient).
  p.copy_(std::get<0>(at::linalg_qr(p, "reduced")));
}

void PowerSgdCodec::remember(int64_t buffer_id, const at::Tensor& q) {
  // A zero or non-finite Q would stall the power iteration: draw a fresh one next time.
  if (q.numel() == 0 || !at::isfinite(q).all().item<bool>() || q.abs().max().item<float>() == 0) {
    q_.erase(buffer_id);
    return;
  }
  q_[buffer_id] = q.clone();
}

Payload PowerSgdCodec::encode(const at::Tensor& x, int64_t buffer_id) {
  at::Tensor m = to_matrix(x);
  at::Tensor p = project(m, buffer_id);
  orthonormalize(p);
  at::Tensor q = at::mm(m.t(), p);
  remember(buffer_id, q);
  return {{p, q}};
}

at::Tensor PowerSgdCodec::decode(const Payload& payload, int64_t numel) const {
  if (numel == 0) return at::empty({0}, float_options());
  return at::mm(payload.parts.at(0), payload.parts.at(1).t()).view({-1}).narrow(0, 0, numel).contiguous();
}

// --- specs ----------------------------------------------------------------------------------------------

std::unique_ptr<Codec> make_codec(const std::string& spec) {
  auto bad = [&](const std::string& why) -> UsageError {
    return UsageError("compression '" + spec + "' is not valid" + (why.empty() ? "" : " (" + why + ")") +
                      "; valid forms: " + kValidSpecs);
  };
  if (spec == "none") return std::make_unique<IdentityCodec>();
  if (spec == "bf16") return std::make_unique<CastCodec>(at::kBFloat16);
  if (spec == "fp16") return std::make_unique<CastCodec>(at::kHalf);
  if (spec == "int8") return std::make_unique<QuantizeCodec>(8);
  if (spec == "int4") return std::make_unique<QuantizeCodec>(4);
  const auto colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  if (kind == "topk") {
    if (arg.empty()) throw bad("topk needs a fraction");
    char* end = nullptr;
    const double f = std::strtod(arg.c_str(), &end);
    if (end != arg.c_str() + arg.size() || !(f > 0 && f <= 1)) throw bad("the fraction must be a number in (0, 1]");
    return std::make_unique<TopKCodec>(f);
  }
  if (kind == "powersgd") {
    if (arg.empty() || arg.size() > 6 || arg.find_first_not_of("0123456789") != std::string::npos)
      throw bad("the rank must be a whole number >= 1");
    const int64_t r = std::stoll(arg);
    if (r < 1) throw bad("the rank must be a whole number >= 1");
    return std::make_unique<PowerSgdCodec>(r);
  }
  throw bad("");
}

// --- error feedback -------------------------------------------------------------------------------------

at::Tensor ErrorFeedback::corrected(const at::Tensor& x, int64_t buffer_id, Stage stage) const {
  at::Tensor flat = flat_input(x, "error feedback");
  auto it = residuals_.find({buffer_id, stage});
  if (it == residuals_.end()) return flat.clone();
  if (it->second.numel() != flat.numel())
    throw UsageError("error feedback: buffer " + std::to_string(buffer_id) + " had " +
                     std::to_string(it->second.numel()) + " elements and now has " + std::to_string(flat.numel()) +
                     "; give each buffer its own id, or reset()");
  return flat + it->second;
}

void ErrorFeedback::record(const at::Tensor& corrected, const at::Tensor& sent, int64_t buffer_id, Stage stage) {
  residuals_[{buffer_id, stage}] = corrected.reshape({-1}) - sent.reshape({-1});
}

Payload ErrorFeedback::encode(Codec& codec, const at::Tensor& x, int64_t buffer_id) {
  at::Tensor c = corrected(x, buffer_id);
  Payload payload = codec.encode(c, buffer_id);
  record(c, codec.decode(payload, c.numel()), buffer_id);
  return payload;
}

at::Tensor ErrorFeedback::residual(int64_t buffer_id, Stage stage) const {
  auto it = residuals_.find({buffer_id, stage});
  return it == residuals_.end() ? at::Tensor() : it->second;
}

// --- the all-reduce -------------------------------------------------------------------------------------

double CompressedAllReduceStats::ratio() const {
  return bytes_sent == 0 ? 1.0 : static_cast<double>(bytes_uncompressed) / static_cast<double>(bytes_sent);
}

namespace {

using Stage = ErrorFeedback::Stage;

at::Tensor corrected_or_copy(ErrorFeedback* feedback, const at::Tensor& x, int64_t id, Stage stage) {
  return feedback ? feedback->corrected(x, id, stage) : x.reshape({-1}).clone();
}

// Elementwise codecs: all-to-all of encoded chunks, owners average in float32, all-gather of the encoded averages.
int64_t reduce_scatter_all_gather(Communicator& comm, at::Tensor& flat, Codec& codec, ErrorFeedback* feedback,
                                  int64_t id) {
  const int n = comm.size();
  const int64_t numel = flat.numel();
  const int64_t align = codec.alignment();
  const int64_t chunk = ceil_div(ceil_div(numel, n), align) * align;

  at::Tensor input = corrected_or_copy(feedback, flat, id, Stage::Input);
  at::Tensor padded = at::constant_pad_nd(input, {0, n * chunk - numel});
  std::vector<Payload> mine;
  for (int i = 0; i < n; ++i) mine.push_back(codec.encode(padded.narrow(0, i * chunk, chunk), id));
  if (feedback) {
    std::vector<at::Tensor> sent;
    for (int i = 0; i < n; ++i) sent.push_back(codec.decode(mine[i], chunk));
    feedback->record(input, at::cat(sent).narrow(0, 0, numel), id, Stage::Input);
  }

  // Slice i of each send buffer is chunk i encoded; slice j of each receive buffer is rank j's encoding of mine.
  const Payload& layout = mine[0];
  std::vector<at::Tensor> received;
  std::vector<WorkPtr> works;
  for (size_t p = 0; p < layout.parts.size(); ++p) {
    std::vector<at::Tensor> slices;
    for (int i = 0; i < n; ++i) slices.push_back(mine[i].parts[p].reshape({-1}));
    at::Tensor send = at::cat(slices);
    received.push_back(at::empty_like(send));
    works.push_back(comm.all_to_all(send, received.back()));
  }
  wait_all(works);

  at::Tensor sum = codec.decode(slice_payload(received, layout, 0), chunk);
  for (int j = 1; j < n; ++j) sum.add_(codec.decode(slice_payload(received, layout, j), chunk));
  sum.div_(n);

  at::Tensor average = corrected_or_copy(feedback, sum, id, Stage::OwnedAverage);
  Payload encoded = codec.encode(average, id);
  if (feedback) feedback->record(average, codec.decode(encoded, chunk), id, Stage::OwnedAverage);

  std::vector<at::Tensor> gathered;
  works.clear();
  for (const auto& part : encoded.parts) {
    at::Tensor one = part.reshape({-1});
    gathered.push_back(at::empty({n * one.numel()}, one.options()));
    works.push_back(comm.all_gather(one, gathered.back()));
  }
  wait_all(works);

  std::vector<at::Tensor> chunks;
  for (int i = 0; i < n; ++i) chunks.push_back(codec.decode(slice_payload(gathered, encoded, i), chunk));
  flat.copy_(at::cat(chunks).narrow(0, 0, numel));
  return 2 * all_gather_bytes(codec.payload_bytes(chunk), n);
}

// Sparse codecs: all-gather every rank's payload; everyone decodes and sums in rank order.
int64_t all_gather_payloads(Communicator& comm, at::Tensor& flat, Codec& codec, ErrorFeedback* feedback, int64_t id) {
  const int n = comm.size();
  const int64_t numel = flat.numel();
  at::Tensor input = corrected_or_copy(feedback, flat, id, Stage::Input);
  Payload mine = codec.encode(input, id);
  if (feedback) feedback->record(input, codec.decode(mine, numel), id, Stage::Input);

  std::vector<at::Tensor> gathered;
  std::vector<WorkPtr> works;
  for (const auto& part : mine.parts) {
    at::Tensor one = part.reshape({-1});
    gathered.push_back(at::empty({n * one.numel()}, one.options()));
    works.push_back(comm.all_gather(one, gathered.back()));
  }
  wait_all(works);

  at::Tensor sum = codec.decode(slice_payload(gathered, mine, 0), numel);
  for (int r = 1; r < n; ++r) sum.add_(codec.decode(slice_payload(gathered, mine, r), numel));
  flat.copy_(sum.div_(n));
  return all_gather_bytes(mine.bytes(), n);
}

// PowerSGD: average P, orthonormalize, Q = M^T P, average Q; the result is P Q^T.
int64_t low_rank(Communicator& comm, at::Tensor& flat, PowerSgdCodec& codec, ErrorFeedback* feedback, int64_t id) {
  const int n = comm.size();
  const int64_t numel = flat.numel();
  at::Tensor input = corrected_or_copy(feedback, flat, id, Stage::Input);
  at::Tensor m = PowerSgdCodec::to_matrix(input);
  at::Tensor p = codec.project(m, id);
  comm.all_reduce(p, ReduceOp::Avg)->wait();
  PowerSgdCodec::orthonormalize(p);
  at::Tensor q = at::mm(m.t(), p);
  // What this rank contributes to the average is P Q_mine^T: the rest is its residual.
  if (feedback) feedback->record(input, codec.decode({{p, q.clone()}}, numel), id, Stage::Input);
  comm.all_reduce(q, ReduceOp::Avg)->wait();
  codec.remember(id, q);
  flat.copy_(codec.decode({{p, q}}, numel));
  return all_reduce_bytes(4 * p.numel(), n) + all_reduce_bytes(4 * q.numel(), n);
}

}  // namespace

CompressedAllReduceStats compressed_all_reduce(Communicator& comm, at::Tensor& buffer, Codec& codec,
                                               ErrorFeedback* feedback, int64_t buffer_id) {
  at::Tensor flat = flat_input(buffer, "compressed_all_reduce");
  CompressedAllReduceStats stats;
  stats.bytes_uncompressed = all_reduce_bytes(4 * flat.numel(), comm.size());
  if (flat.numel() == 0) return stats;
  switch (codec.exchange()) {
    case Exchange::AllReduce:
      comm.all_reduce(flat, ReduceOp::Avg)->wait();
      stats.bytes_sent = stats.bytes_uncompressed;
      break;
    case Exchange::ReduceScatterAllGather:
      stats.bytes_sent = reduce_scatter_all_gather(comm, flat, codec, feedback, buffer_id);
      break;
    case Exchange::AllGather:
      stats.bytes_sent = all_gather_payloads(comm, flat, codec, feedback, buffer_id);
      break;
    case Exchange::LowRank: {
      auto* power = dynamic_cast<PowerSgdCodec*>(&codec);
      if (!power) throw UsageError("compressed_all_reduce: codec '" + codec.name() + "' claims a low-rank exchange");
      stats.bytes_sent = low_rank(comm, flat, *power, feedback, buffer_id);
      break;
    }
  }
  return stats;
}

}  // namespace crosstrain::comm
