// Private to src/data: the counter-based randomness of the CTR sources. Every value is a hash of what it belongs
// to (seed, stream, example, field, ...), never the next draw of a sequential generator, so any rank can make any
// example, in any order, and get the same bits.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

namespace crosstrain::data::ctr_random {

// splitmix64's finalizer: a bijection of 64-bit words whose output bits each depend on every input bit.
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A hash of a tuple of words: chained, so (a, b) and (b, a) differ.
inline uint64_t mix(uint64_t a, uint64_t b) { return splitmix64(a ^ splitmix64(b + 0x632be59bd9b4e019ULL)); }
inline uint64_t mix(uint64_t a, uint64_t b, uint64_t c) { return mix(mix(a, b), c); }
inline uint64_t mix(uint64_t a, uint64_t b, uint64_t c, uint64_t d) { return mix(mix(a, b, c), d); }

// A uniform double in the open interval (0, 1) from the top 53 bits (never 0, so log(u) is finite).
inline double uniform(uint64_t h) { return (static_cast<double>(h >> 11) + 0.5) * 0x1.0p-53; }

// FNV-1a of a byte string (std::hash is not stable across standard libraries).
inline uint64_t fnv1a(const char* data, size_t size) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (size_t i = 0; i < size; ++i) {
    h ^= static_cast<unsigned char>(data[i]);
    h *= 0x100000001b3ULL;
  }
  return h;
}

// Ranks 1..n with P(k) proportional to 1 / k^s, by rejection-inversion (Hörmann and Derflinger, "Rejection-
// inversion to generate variates from monotone discrete distributions", 1996): invert the integral H of the
// continuous hat x^-s, round to the nearest integer, accept almost always. O(1) memory and expected O(1) time for
// any n (tables of a billion rows need no cumulative table). The uniforms come from the caller's hash `key`, one per
// attempt, so a sample is a pure function of the key.
class ZipfRanks {
 public:
  ZipfRanks(int64_t n, double s) : n_(n), s_(s) {
    if (s_ <= 0) return;  // uniform: sampled directly
    h_x1_ = big_h(1.5) - 1.0;
    h_n_ = big_h(static_cast<double>(n_) + 0.5);
    squeeze_ = 2.0 - big_h_inverse(big_h(2.5) - small_h(2.0));
  }

  int64_t sample(uint64_t key) const {
    if (s_ <= 0) return 1 + static_cast<int64_t>(uniform(key) * static_cast<double>(n_)) % n_;
    for (uint64_t attempt = 0;; ++attempt) {
      const double u = h_n_ + uniform(mix(key, attempt)) * (h_x1_ - h_n_);
      const double x = big_h_inverse(u);
      int64_t k = static_cast<int64_t>(x + 0.5);
      if (k < 1) k = 1;
      if (k > n_) k = n_;
      const double kd = static_cast<double>(k);
      // The squeeze accepts most draws without evaluating H; the rest are accepted under the hat's integral.
      if (kd - x <= squeeze_ || u >= big_h(kd + 0.5) - small_h(kd)) return k;
    }
  }

 private:
  // log1p(x) / x and expm1(x) / x, continuous at 0 (s = 1 makes the exponent 1 - s vanish).
  static double log1p_over(double x) { return std::fabs(x) > 1e-8 ? std::log1p(x) / x : 1.0 - x / 2.0; }
  static double expm1_over(double x) { return std::fabs(x) > 1e-8 ? std::expm1(x) / x : 1.0 + x / 2.0; }
  double small_h(double x) const { return std::exp(-s_ * std::log(x)); }
  // H(x) = (x^(1-s) - 1) / (1 - s), log(x) at s = 1: an antiderivative of x^-s.
  double big_h(double x) const {
    const double log_x = std::log(x);
    return expm1_over((1.0 - s_) * log_x) * log_x;
  }
  double big_h_inverse(double y) const {
    double t = y * (1.0 - s_);
    if (t < -1.0) t = -1.0;  // rounding at the bottom of the range
    return std::exp(log1p_over(t) * y);
  }

  int64_t n_;
  double s_;
  double h_x1_ = 0, h_n_ = 0, squeeze_ = 0;
};

// A keyed bijection of [0, n): a permutation of the next power of two (multiply by an odd number, add, xor-shift,
// multiply again, all modulo 2^bits, each step invertible), walked until it lands in [0, n) ("cycle walking"). It
// spreads a table's hot ranks over its rows, as hashing spreads real categories. Fewer than 2 steps on average,
// as n is more than half of the power of two.
class RowScramble {
 public:
  RowScramble(int64_t n, uint64_t key) : n_(static_cast<uint64_t>(n)) {
    while (bits_ < 64 && (uint64_t{1} << bits_) < n_) ++bits_;
    mask_ = bits_ >= 64 ? ~uint64_t{0} : (uint64_t{1} << bits_) - 1;
    shift_ = bits_ / 2 > 0 ? bits_ / 2 : 1;
    mul1_ = splitmix64(key) | 1;
    mul2_ = splitmix64(key + 1) | 1;
    add_ = splitmix64(key + 2);
  }

  int64_t operator()(int64_t index) const {
    if (n_ <= 1) return 0;
    uint64_t x = static_cast<uint64_t>(index);
    do {
      x = (x * mul1_ + add_) & mask_;
      x ^= x >> shift_;
      x = (x * mul2_) & mask_;
    } while (x >= n_);
    return static_cast<int64_t>(x);
  }

 private:
  uint64_t n_;
  int bits_ = 0;
  uint64_t mask_ = 0, mul1_ = 1, mul2_ = 1, add_ = 0;
  int shift_ = 1;
};

}  // namespace crosstrain::data::ctr_random
