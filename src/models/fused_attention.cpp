#include "crosstrain/models/fused_attention.h"

#include <ATen/Parallel.h>
#include <cblas.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

namespace crosstrain::models {

namespace {

// Query and key tile edge. 64 x 64 x hd (hd <= 64) stays under OpenBLAS's threshold for splitting one GEMM over
// threads (we already run one (batch, head) per thread), and a tile of scores (16 KiB) stays in L1/L2.
constexpr int64_t kTile = 64;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// CROSSTRAIN_FUSED_ATTENTION=0 starts the process with the dense path (to rule the kernel in or out of a problem
// without rebuilding).
bool fused_by_default() {
  const char* value = std::getenv("CROSSTRAIN_FUSED_ATTENTION");
  return value == nullptr || std::string(value) != "0";
}
std::atomic<bool> fused_enabled{fused_by_default()};

// The elementwise loops are compiled twice, for AVX2+FMA and for baseline x86-64, and the loader picks the one
// this CPU runs (GCC's target_clones): the library stays portable, the exponentials run 8 wide where they can.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CT_VECTOR_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CT_VECTOR_CLONES
#endif

// exp(x) in fp32 without a libm call, so that loops over it vectorise: x = n ln2 + r with |r| <= ln2/2, e^r by
// the Cephes polynomial (relative error ~2e-7), 2^n put into the exponent bits. Inputs below -87 give ~1e-38 (the
// callers write exact zeros where keys are hidden); NaN stays NaN.
inline float fast_exp(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  // Adding 1.5 * 2^23 rounds x / ln2 to an integer held in the low mantissa bits (no rounding instruction).
  const float magic = 12582912.0f;
  const float t = x * 1.44269504088896341f + magic;
  const float n = t - magic;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &t, sizeof bits);
  const int32_t exponent = (bits - 0x4B400000 + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &exponent, sizeof two_n);
  return p * two_n;
}

CT_VECTOR_CLONES float row_max(const float* x, int64_t n) {
  float m = kNegInf;
#pragma omp simd reduction(max : m)
  for (int64_t i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;  // (std::max's form does not vectorise here)
  return m;
}

// x[i] = exp(x[i] - shift) for the n visible keys; returns their sum.
CT_VECTOR_CLONES float exp_shifted_sum(float* x, int64_t n, float shift) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) {
    x[i] = fast_exp(x[i] - shift);
    sum += x[i];
  }
  return sum;
}

// Backward of one row of a tile: p = exp(s - lse) (the forward's probabilities), ds = p (dp - d).
CT_VECTOR_CLONES void probabilities_and_score_grads(float* s, float* dp, int64_t n, float lse, float d) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float p = fast_exp(s[i] - lse);
    s[i] = p;
    dp[i] = p * (dp[i] - d);
  }
}

CT_VECTOR_CLONES void scale_row(float* x, int64_t n, float factor) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) x[i] *= factor;
}

CT_VECTOR_CLONES float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// Row-major C[m, n] = alpha op(A) op(B) + beta C, op = transpose where asked: one BLAS call per tile product,
// no ATen dispatch (which would cost more than a 64 x 64 product).
void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), alpha, a, static_cast<int>(lda), b,
              static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
}

// One head's [T, hd] matrix: row t at p + t * ld.
struct Rows {
  float* p;
  int64_t ld;
  float* row(int64_t t) const { return p + t * ld; }
};

// The (batch, head) matrices of an fp32 [B, H, T, hd] tensor whose last dimension is contiguous.
struct Heads {
  float* base;
  int64_t stride_b, stride_h, ld, H;
  explicit Heads(const at::Tensor& t)
      : base(t.data_ptr<float>()), stride_b(t.stride(0)), stride_h(t.stride(1)),
        // With one row the row stride is never used; BLAS still wants it >= hd.
        ld(t.size(2) > 1 ? t.stride(2) : t.size(3)), H(t.size(1)) {
    TORCH_CHECK(ld >= t.size(3) && ld < INT_MAX, "causal_attention: row stride ", ld, " of a [B, H, T, hd] input ",
                "does not fit a BLAS leading dimension; pass a contiguous tensor");
  }
  Rows at(int64_t bh) const { return {base + (bh / H) * stride_b + (bh % H) * stride_h, ld}; }
};

// fp32 with a contiguous last dimension: the tensor itself when it already is (a view of a fused qkv projection
// is read in place), else a converted copy.
at::Tensor fp32_rows(const at::Tensor& t) {
  if (t.scalar_type() == at::kFloat && t.stride(3) == 1 && (t.size(2) <= 1 || t.stride(2) >= t.size(3))) return t;
  return t.to(at::kFloat).contiguous();
}

// A [B, H, T, hd] fp32 result laid out as [B, T, H, hd]: what GPT's transpose(1, 2).contiguous() wants, so that
// copy is free, and what gradients of heads cut from a [B, T, 3C] projection look like.
at::Tensor empty_heads(const at::Tensor& like, bool zero) {
  const auto B = like.size(0), H = like.size(1), T = like.size(2), hd = like.size(3);
  auto options = at::TensorOptions().dtype(at::kFloat).device(like.device());
  return (zero ? at::zeros({B, T, H, hd}, options) : at::empty({B, T, H, hd}, options)).transpose(1, 2);
}

struct Scratch {
  std::vector<float> scores, grads, acc, max, sum;
  explicit Scratch(int64_t hd)
      : scores(kTile * kTile), grads(kTile * kTile), acc(kTile * hd), max(kTile), sum(kTile) {}
};

// Keys a query row may see within a key tile: those at or before it.
int64_t visible(int64_t query, int64_t key0, int64_t cols) { return std::clamp<int64_t>(query + 1 - key0, 0, cols); }

// Online softmax of one query tile (rows [r0, r0 + rows)) over the key tiles up to the diagonal; writes the
// tile's output rows and their log-sum-exp.
void forward_query_tile(Rows q, Rows k, Rows v, Rows out, float* lse, int64_t r0, int64_t rows, int64_t hd,
                        float scale, Scratch& s) {
  float *S = s.scores.data(), *acc = s.acc.data(), *m = s.max.data(), *l = s.sum.data();
  std::fill(acc, acc + rows * hd, 0.0f);
  std::fill(m, m + rows, kNegInf);
  std::fill(l, l + rows, 0.0f);
  for (int64_t c0 = 0; c0 < r0 + rows; c0 += kTile) {
    const int64_t cols = std::min(kTile, r0 + rows - c0);
    gemm(false, true, rows, cols, hd, scale, q.row(r0), q.ld, k.row(c0), k.ld, 0.0f, S, kTile);
    for (int64_t r = 0; r < rows; ++r) {
      float* srow = S + r * kTile;
      const int64_t n = visible(r0 + r, c0, cols);  // >= 1: tiles start at or before the diagonal
      const float m_new = std::max(m[r], row_max(srow, n));
      const float correction = std::exp(m[r] - m_new);  // 0 on the first tile (m = -inf)
      l[r] = l[r] * correction + exp_shifted_sum(srow, n, m_new);
      std::fill(srow + n, srow + cols, 0.0f);  // hidden keys: probability exactly 0
      if (correction != 1.0f) scale_row(acc + r * hd, hd, correction);
      m[r] = m_new;
    }
    gemm(false, false, rows, hd, cols, 1.0f, S, kTile, v.row(c0), v.ld, 1.0f, acc, hd);
  }
  for (int64_t r = 0; r < rows; ++r) {
    float* o = out.row(r0 + r);
    std::copy(acc + r * hd, acc + (r + 1) * hd, o);
    scale_row(o, hd, 1.0f / l[r]);
    lse[r0 + r] = m[r] + std::log(l[r]);
  }
}

// out and lse: fp32 [B, H, T, hd] (rows contiguous) and [B, H, T].
void attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                       const at::Tensor& lse) {
  const int64_t BH = q.size(0) * q.size(1), T = q.size(2), hd = q.size(3);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const Heads Q(q), K(k), V(v), O(out);
  float* L = lse.data_ptr<float>();
  at::parallel_for(0, BH, 1, [&](int64_t begin, int64_t end) {
    Scratch s(hd);
    for (int64_t bh = begin; bh < end; ++bh)
      for (int64_t r0 = 0; r0 < T; r0 += kTile)
        forward_query_tile(Q.at(bh), K.at(bh), V.at(bh), O.at(bh), L + bh * T, r0, std::min(kTile, T - r0), hd,
                           scale, s);
  });
}

struct HeadGrads {
  Rows q, k, v, out, dout, dq, dk, dv;
  const float* lse;
  float* d;  // rowsum(dout * out), one per query
};

// FlashAttention-2's backward for one key tile (keys [c0, c0 + cols)) against the query tiles at and below the
// diagonal: recompute P = exp(S - lse), then dV += P^T dO, dP = dO V^T, dS = P (dP - D), dQ += dS K scale,
// dK += dS^T Q scale.
void backward_key_tile(const HeadGrads& g, int64_t c0, int64_t T, int64_t hd, float scale, Scratch& s) {
  float *P = s.scores.data(), *dS = s.grads.data();
  const int64_t cols = std::min(kTile, T - c0);
  for (int64_t r0 = c0; r0 < T; r0 += kTile) {
    const int64_t rows = std::min(kTile, T - r0);
    gemm(false, true, rows, cols, hd, scale, g.q.row(r0), g.q.ld, g.k.row(c0), g.k.ld, 0.0f, P, kTile);
    gemm(false, true, rows, cols, hd, 1.0f, g.dout.row(r0), g.dout.ld, g.v.row(c0), g.v.ld, 0.0f, dS, kTile);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t n = visible(r0 + r, c0, cols);
      probabilities_and_score_grads(P + r * kTile, dS + r * kTile, n, g.lse[r0 + r], g.d[r0 + r]);
      std::fill(P + r * kTile + n, P + r * kTile + cols, 0.0f);
      std::fill(dS + r * kTile + n, dS + r * kTile + cols, 0.0f);
    }
    gemm(true, false, cols, hd, rows, 1.0f, P, kTile, g.dout.row(r0), g.dout.ld, 1.0f, g.dv.row(c0), g.dv.ld);
    gemm(false, false, rows, hd, cols, scale, dS, kTile, g.k.row(c0), g.k.ld, 1.0f, g.dq.row(r0), g.dq.ld);
    gemm(true, false, cols, hd, rows, scale, dS, kTile, g.q.row(r0), g.q.ld, 1.0f, g.dk.row(c0), g.dk.ld);
  }
}

// dq, dk, dv: zeroed fp32 [B, H, T, hd]; the rest as the forward saved them.
void attention_backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                        const at::Tensor& lse, const at::Tensor& dout, const at::Tensor& dq, const at::Tensor& dk,
                        const at::Tensor& dv) {
  const int64_t BH = q.size(0) * q.size(1), T = q.size(2), hd = q.size(3);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const Heads Q(q), K(k), V(v), O(out), dO(dout), dQ(dq), dK(dk), dV(dv);
  const float* L = lse.data_ptr<float>();
  at::parallel_for(0, BH, 1, [&](int64_t begin, int64_t end) {
    Scratch s(hd);
    std::vector<float> d(T);
    for (int64_t bh = begin; bh < end; ++bh) {
      HeadGrads g{Q.at(bh), K.at(bh), V.at(bh), O.at(bh), dO.at(bh), dQ.at(bh), dK.at(bh), dV.at(bh), L + bh * T,
                  d.data()};
      for (int64_t t = 0; t < T; ++t) d[t] = dot(g.dout.row(t), g.out.row(t), hd);
      for (int64_t c0 = 0; c0 < T; c0 += kTile) backward_key_tile(g, c0, T, hd, scale, s);
    }
  });
}

// Saves q, k, v (fp32, read in place where they already are), the fp32 output and the per-row log-sum-exp.
struct CausalAttentionFunction : public torch::autograd::Function<CausalAttentionFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v) {
    auto q32 = fp32_rows(q), k32 = fp32_rows(k), v32 = fp32_rows(v);
    auto out = empty_heads(q, false);
    auto lse = at::empty({q.size(0), q.size(1), q.size(2)}, out.options());
    attention_forward(q32, k32, v32, out, lse);
    ctx->save_for_backward({q32, k32, v32, out, lse});
    return out.to(q.scalar_type());
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const auto dtype = grads[0].scalar_type();  // the output's, which is the inputs'
    auto dq = empty_heads(q, true), dk = empty_heads(q, true), dv = empty_heads(q, true);
    attention_backward(q, k, v, out, lse, fp32_rows(grads[0]), dq, dk, dv);
    return {dq.to(dtype), dk.to(dtype), dv.to(dtype)};
  }
};

void check_heads(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  TORCH_CHECK(q.dim() == 4, "causal_attention: q must be [B, H, T, hd], got ", q.sizes());
  TORCH_CHECK(k.sizes() == q.sizes() && v.sizes() == q.sizes(), "causal_attention: q ", q.sizes(), ", k ",
              k.sizes(), " and v ", v.sizes(), " must have one shape, [B, H, T, hd]");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "causal_attention: q, k and v must have one dtype; got ", q.scalar_type(), ", ", k.scalar_type(),
              ", ", v.scalar_type());
  TORCH_CHECK(q.device().is_cpu(), "causal_attention is a CPU kernel; got a tensor on ", q.device(),
              " (use reference_causal_attention there)");
  TORCH_CHECK(at::isFloatingType(q.scalar_type()), "causal_attention: floating-point q, k, v expected, got ",
              q.scalar_type());
}

}  // namespace

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  check_heads(q, k, v);
  if (q.scalar_type() == at::kDouble) return reference_causal_attention(q, k, v);
  if (q.numel() == 0) return reference_causal_attention(q, k, v);
  return CausalAttentionFunction::apply(q, k, v);
}

at::Tensor reference_causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& mask, double dropout, bool train) {
  const int64_t T = q.size(-2);
  const at::Tensor hidden = mask.defined() ? mask.slice(0, 0, T).slice(1, 0, T)
                                           : at::ones({T, T}, q.options().dtype(at::kBool)).triu(1);
  // Scaling q ([T, hd]) instead of the scores ([T, T]) saves a pass over the largest activation.
  auto att = at::matmul(q * (1.0 / std::sqrt(static_cast<double>(q.size(-1)))), k.transpose(-2, -1));
  att = att.masked_fill(hidden, -std::numeric_limits<float>::infinity());
  att = at::dropout(at::softmax(att, -1), dropout, train);
  return at::matmul(att, v);
}

void set_fused_attention(bool enabled) { fused_enabled.store(enabled); }
bool fused_attention_enabled() { return fused_enabled.load(); }

}  // namespace crosstrain::models
