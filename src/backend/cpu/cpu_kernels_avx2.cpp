// AVX2 + FMA + F16C kernels (this file is compiled with -mavx2 -mfma -mf16c
// and only called after a run-time CPU check). Header inline functions (e.g.
// dtype.h's conversions) are not used here: the linker could keep this
// file's AVX copy for callers on CPUs without AVX.
//
// GEMV: each 32-element weight block is widened to four 8-lane fp32 vectors
// and dotted with the activations; the block scale multiplies the block's
// partial dot once (d * sum(q * x)). Q4_1's offset uses precomputed block sums
// of x: sum((d q + m) x) = d sum(q x) + m sum(x). All arithmetic is fp32.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_kernels.h"

#if defined(__x86_64__)

namespace osprey::cpu {
namespace {

inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehdup_ps(lo);
  lo = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, lo);
  lo = _mm_add_ss(lo, sh);
  return _mm_cvtss_f32(lo);
}

inline float half_to_float(uint16_t h) {
  return _cvtsh_ss(h);
}

// Widens 8 bytes at p to 8 int32 lanes (zero-extended).
inline __m256i load_u8x8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
inline __m256i load_i8x8(const int8_t* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// The 32 weights of a Q4 block as fp32 nibble values q in [0, 15]
// (elements 0-7, 8-15, 16-23, 24-31).
inline void q4_block_to_f32(const uint8_t* qs, __m256* w) {
  const __m256i mask = _mm256_set1_epi32(0x0f);
  const __m256i a = load_u8x8(qs);
  const __m256i b = load_u8x8(qs + 8);
  w[0] = _mm256_cvtepi32_ps(_mm256_and_si256(a, mask));
  w[1] = _mm256_cvtepi32_ps(_mm256_and_si256(b, mask));
  w[2] = _mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4));
  w[3] = _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4));
}

inline __m256 dot32(const __m256* w, const float* x) {
  __m256 s = _mm256_mul_ps(w[0], _mm256_loadu_ps(x));
  s = _mm256_fmadd_ps(w[1], _mm256_loadu_ps(x + 8), s);
  s = _mm256_fmadd_ps(w[2], _mm256_loadu_ps(x + 16), s);
  s = _mm256_fmadd_ps(w[3], _mm256_loadu_ps(x + 24), s);
  return s;
}

// ---- quantised GEMV, N activation rows per weight row -----------------------

template <int N>
void gemv_q4_1_n(const uint8_t* row, int64_t nb, const float* x, int64_t ldx, const float* xsum, float* res) {
  const auto* b = reinterpret_cast<const BlockQ4_1*>(row);
  __m256 acc[N];
  __m128 macc[N];
  for (int i = 0; i < N; ++i) {
    acc[i] = _mm256_setzero_ps();
    macc[i] = _mm_setzero_ps();
  }
  for (int64_t j = 0; j < nb; ++j) {
    __m256 w[4];
    q4_block_to_f32(b[j].qs, w);
    // d and m are adjacent fp16 values: one conversion for both.
    int32_t dm_bits;
    std::memcpy(&dm_bits, &b[j].d, 4);
    const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(dm_bits));
    const __m256 d = _mm256_broadcastss_ps(dm);
    const __m128 m = _mm_movehdup_ps(dm);
    for (int i = 0; i < N; ++i) {
      acc[i] = _mm256_fmadd_ps(d, dot32(w, x + i * ldx + j * 32), acc[i]);
      macc[i] = _mm_fmadd_ss(m, _mm_load_ss(xsum + i * nb + j), macc[i]);
    }
  }
  for (int i = 0; i < N; ++i) res[i] = hsum(acc[i]) + _mm_cvtss_f32(macc[i]);
}

template <int N>
void gemv_q4_0_n(const uint8_t* row, int64_t nb, const float* x, int64_t ldx, const float* /*xsum*/, float* res) {
  const auto* b = reinterpret_cast<const BlockQ4_0*>(row);
  const __m256 eight = _mm256_set1_ps(8.0f);
  __m256 acc[N];
  for (int i = 0; i < N; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t j = 0; j < nb; ++j) {
    __m256 w[4];
    q4_block_to_f32(b[j].qs, w);
    for (int t = 0; t < 4; ++t) w[t] = _mm256_sub_ps(w[t], eight);  // exact: small integers
    const __m256 d = _mm256_set1_ps(half_to_float(b[j].d));
    for (int i = 0; i < N; ++i) acc[i] = _mm256_fmadd_ps(d, dot32(w, x + i * ldx + j * 32), acc[i]);
  }
  for (int i = 0; i < N; ++i) res[i] = hsum(acc[i]);
}

template <int N>
void gemv_q8_0_n(const uint8_t* row, int64_t nb, const float* x, int64_t ldx, const float* /*xsum*/, float* res) {
  const auto* b = reinterpret_cast<const BlockQ8_0*>(row);
  __m256 acc[N];
  for (int i = 0; i < N; ++i) acc[i] = _mm256_setzero_ps();
  for (int64_t j = 0; j < nb; ++j) {
    __m256 w[4];
    for (int t = 0; t < 4; ++t) w[t] = _mm256_cvtepi32_ps(load_i8x8(b[j].qs + 8 * t));
    const __m256 d = _mm256_set1_ps(half_to_float(b[j].d));
    for (int i = 0; i < N; ++i) acc[i] = _mm256_fmadd_ps(d, dot32(w, x + i * ldx + j * 32), acc[i]);
  }
  for (int i = 0; i < N; ++i) res[i] = hsum(acc[i]);
}

// ---- plain-float GEMV ---------------------------------------------------------

inline __m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
inline __m256 load8(const uint16_t* p, std::integral_constant<int, 0>) {  // fp16
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline __m256 load8(const uint16_t* p, std::integral_constant<int, 1>) {  // bf16
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

template <WeightFormat F>
inline __m256 load_w8(const void* row, int64_t off) {
  if constexpr (F == WeightFormat::kF32) {
    return load8(static_cast<const float*>(row) + off);
  } else if constexpr (F == WeightFormat::kF16) {
    return load8(static_cast<const uint16_t*>(row) + off, std::integral_constant<int, 0>{});
  } else {
    return load8(static_cast<const uint16_t*>(row) + off, std::integral_constant<int, 1>{});
  }
}

template <WeightFormat F>
inline float load_w1(const void* row, int64_t off) {
  if constexpr (F == WeightFormat::kF32) {
    return static_cast<const float*>(row)[off];
  } else if constexpr (F == WeightFormat::kF16) {
    return half_to_float(static_cast<const uint16_t*>(row)[off]);
  } else {
    const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(row)[off]) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
}

template <WeightFormat F, int N>
void gemv_float_n(const void* row, int64_t k, const float* x, int64_t ldx, float* res) {
  __m256 acc[N][2];
  for (int i = 0; i < N; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  int64_t t = 0;
  for (; t + 16 <= k; t += 16) {
    const __m256 w0 = load_w8<F>(row, t);
    const __m256 w1 = load_w8<F>(row, t + 8);
    for (int i = 0; i < N; ++i) {
      acc[i][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i * ldx + t), acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + i * ldx + t + 8), acc[i][1]);
    }
  }
  for (; t + 8 <= k; t += 8) {
    const __m256 w0 = load_w8<F>(row, t);
    for (int i = 0; i < N; ++i) acc[i][0] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + i * ldx + t), acc[i][0]);
  }
  for (int i = 0; i < N; ++i) res[i] = hsum(_mm256_add_ps(acc[i][0], acc[i][1]));
  for (; t < k; ++t) {
    const float w = load_w1<F>(row, t);
    for (int i = 0; i < N; ++i) res[i] += w * x[i * ldx + t];
  }
}

template <WeightFormat F, int N>
inline void gemv_row_n(const uint8_t* row, int64_t k, const float* x, int64_t ldx, const float* xsum, float* res) {
  if constexpr (F == WeightFormat::kQ4_1) {
    gemv_q4_1_n<N>(row, k / 32, x, ldx, xsum, res);
  } else if constexpr (F == WeightFormat::kQ4_0) {
    gemv_q4_0_n<N>(row, k / 32, x, ldx, xsum, res);
  } else if constexpr (F == WeightFormat::kQ8_0) {
    gemv_q8_0_n<N>(row, k / 32, x, ldx, xsum, res);
  } else {
    gemv_float_n<F, N>(row, k, x, ldx, res);
  }
}

template <WeightFormat F>
void gemv_avx2(const void* w, int64_t w_row_bytes, int64_t k, const float* x, int64_t ldx, const float* xsum, int n,
               float* out, int64_t ldo, int64_t r0, int64_t r1) {
  const int64_t nb = k / 32;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = static_cast<const uint8_t*>(w) + r * w_row_bytes;
    int i = 0;
    float res[4];
    for (; i + 4 <= n; i += 4) {
      gemv_row_n<F, 4>(row, k, x + i * ldx, ldx, xsum ? xsum + i * nb : nullptr, res);
      for (int t = 0; t < 4; ++t) out[(i + t) * ldo + r] = res[t];
    }
    const float* xs = xsum ? xsum + i * nb : nullptr;
    switch (n - i) {
      case 3:
        gemv_row_n<F, 3>(row, k, x + i * ldx, ldx, xs, res);
        break;
      case 2:
        gemv_row_n<F, 2>(row, k, x + i * ldx, ldx, xs, res);
        break;
      case 1:
        gemv_row_n<F, 1>(row, k, x + i * ldx, ldx, xs, res);
        break;
      default:
        break;
    }
    for (int t = 0; t < n - i; ++t) out[(i + t) * ldo + r] = res[t];
  }
}

// ---- dequantise rows to fp32 -------------------------------------------------

template <WeightFormat F>
void dequant_rows_avx2(const void* w, int64_t w_row_bytes, int64_t k, int64_t rows, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = static_cast<const uint8_t*>(w) + r * w_row_bytes;
    float* o = dst + r * k;
    if constexpr (F == WeightFormat::kQ4_1 || F == WeightFormat::kQ4_0) {
      for (int64_t j = 0; j < k / 32; ++j) {
        __m256 q[4];
        __m256 d, m;
        if constexpr (F == WeightFormat::kQ4_1) {
          const auto& b = reinterpret_cast<const BlockQ4_1*>(row)[j];
          q4_block_to_f32(b.qs, q);
          d = _mm256_set1_ps(half_to_float(b.d));
          m = _mm256_set1_ps(half_to_float(b.m));
        } else {
          const auto& b = reinterpret_cast<const BlockQ4_0*>(row)[j];
          q4_block_to_f32(b.qs, q);
          for (int t = 0; t < 4; ++t) q[t] = _mm256_sub_ps(q[t], _mm256_set1_ps(8.0f));
          d = _mm256_set1_ps(half_to_float(b.d));
          m = _mm256_setzero_ps();
        }
        // d * q + m rounded like the scalar reference (no fused rounding).
        for (int t = 0; t < 4; ++t) _mm256_storeu_ps(o + j * 32 + 8 * t, _mm256_add_ps(_mm256_mul_ps(d, q[t]), m));
      }
    } else if constexpr (F == WeightFormat::kQ8_0) {
      for (int64_t j = 0; j < k / 32; ++j) {
        const auto& b = reinterpret_cast<const BlockQ8_0*>(row)[j];
        const __m256 d = _mm256_set1_ps(half_to_float(b.d));
        for (int t = 0; t < 4; ++t) {
          _mm256_storeu_ps(o + j * 32 + 8 * t, _mm256_mul_ps(d, _mm256_cvtepi32_ps(load_i8x8(b.qs + 8 * t))));
        }
      }
    } else {
      int64_t t = 0;
      for (; t + 8 <= k; t += 8) _mm256_storeu_ps(o + t, load_w8<F>(row, t));
      for (; t < k; ++t) o[t] = load_w1<F>(row, t);
    }
  }
}

// ---- panel GEMM: RX activation rows x RP panel rows per micro-tile -----------

template <int RX, int RP>
inline void panel_tile(const float* x, int64_t ldx, const float* p, int64_t k, float* out, int64_t ldo) {
  __m256 acc[RX][RP];
  for (int i = 0; i < RX; ++i)
    for (int j = 0; j < RP; ++j) acc[i][j] = _mm256_setzero_ps();
  int64_t t = 0;
  for (; t + 8 <= k; t += 8) {
    __m256 xv[RX];
    for (int i = 0; i < RX; ++i) xv[i] = _mm256_loadu_ps(x + i * ldx + t);
    for (int j = 0; j < RP; ++j) {
      const __m256 pv = _mm256_loadu_ps(p + j * k + t);
      for (int i = 0; i < RX; ++i) acc[i][j] = _mm256_fmadd_ps(xv[i], pv, acc[i][j]);
    }
  }
  for (int i = 0; i < RX; ++i) {
    for (int j = 0; j < RP; ++j) {
      float s = hsum(acc[i][j]);
      for (int64_t u = t; u < k; ++u) s += x[i * ldx + u] * p[j * k + u];
      out[i * ldo + j] = s;
    }
  }
}

template <int RX>
inline void panel_row_group(const float* x, int64_t ldx, const float* p, int m, int64_t k, float* out, int64_t ldo) {
  constexpr int kRP = 4;
  int j = 0;
  for (; j + kRP <= m; j += kRP) panel_tile<RX, kRP>(x, ldx, p + j * k, k, out + j, ldo);
  switch (m - j) {
    case 3:
      panel_tile<RX, 3>(x, ldx, p + j * k, k, out + j, ldo);
      break;
    case 2:
      panel_tile<RX, 2>(x, ldx, p + j * k, k, out + j, ldo);
      break;
    case 1:
      panel_tile<RX, 1>(x, ldx, p + j * k, k, out + j, ldo);
      break;
    default:
      break;
  }
}

void panel_gemm_avx2(const float* x, int64_t ldx, int n, const float* p, int m, int64_t k, float* out, int64_t ldo) {
  constexpr int kRX = 3;
  int i = 0;
  for (; i + kRX <= n; i += kRX) panel_row_group<kRX>(x + i * ldx, ldx, p, m, k, out + i * ldo, ldo);
  switch (n - i) {
    case 2:
      panel_row_group<2>(x + i * ldx, ldx, p, m, k, out + i * ldo, ldo);
      break;
    case 1:
      panel_row_group<1>(x + i * ldx, ldx, p, m, k, out + i * ldo, ldo);
      break;
    default:
      break;
  }
}

// ---- vector helpers ---------------------------------------------------------

float dot_avx2(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float s = hsum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

void axpy_avx2(float a, const float* x, float* y, int64_t n);

// Same summation order as dot_avx2 (two 8-lane chains over 16-float steps).
void attn_scores_avx2(const float* q, int nq, int64_t hd, const float* rows, int64_t stride, int64_t len,
                      float scale, float* s, int64_t lds) {
  if (hd != 64) {
    for (int64_t j = 0; j < len; ++j)
      for (int h = 0; h < nq; ++h) s[h * lds + j] = dot_avx2(q + h * hd, rows + j * stride, hd) * scale;
    return;
  }
  for (int64_t j = 0; j < len; ++j) {
    const float* r = rows + j * stride;
    __m256 rv[8];
    for (int t = 0; t < 8; ++t) rv[t] = _mm256_loadu_ps(r + 8 * t);
    for (int h = 0; h < nq; ++h) {
      const float* qh = q + h * 64;
      __m256 s0 = _mm256_mul_ps(_mm256_loadu_ps(qh), rv[0]);
      __m256 s1 = _mm256_mul_ps(_mm256_loadu_ps(qh + 8), rv[1]);
      for (int t = 2; t < 8; t += 2) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * t), rv[t], s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + 8 * t + 8), rv[t + 1], s1);
      }
      s[h * lds + j] = hsum(_mm256_add_ps(s0, s1)) * scale;
    }
  }
}

// o_h += s_h[j] * r_j, one fused multiply-add per element and row in j
// order, as axpy_avx2. Works on 32-float column strips so the accumulators of
// up to 3 heads stay in registers across the rows.
void attn_accum_avx2(const float* s, int64_t lds, int nq, int64_t hd, const float* rows, int64_t stride, int64_t len,
                     float* o) {
  if (hd % 32 != 0) {
    for (int64_t j = 0; j < len; ++j)
      for (int h = 0; h < nq; ++h) axpy_avx2(s[h * lds + j], rows + j * stride, o + h * hd, hd);
    return;
  }
  for (int h0 = 0; h0 < nq; h0 += 3) {
    const int nh = std::min(3, nq - h0);
    for (int64_t c = 0; c < hd; c += 32) {
      __m256 acc[3][4];
      for (int h = 0; h < nh; ++h)
        for (int t = 0; t < 4; ++t) acc[h][t] = _mm256_loadu_ps(o + (h0 + h) * hd + c + 8 * t);
      for (int64_t j = 0; j < len; ++j) {
        const float* r = rows + j * stride + c;
        __m256 rv[4];
        for (int t = 0; t < 4; ++t) rv[t] = _mm256_loadu_ps(r + 8 * t);
        for (int h = 0; h < nh; ++h) {
          const __m256 a = _mm256_broadcast_ss(s + (h0 + h) * lds + j);
          for (int t = 0; t < 4; ++t) acc[h][t] = _mm256_fmadd_ps(a, rv[t], acc[h][t]);
        }
      }
      for (int h = 0; h < nh; ++h)
        for (int t = 0; t < 4; ++t) _mm256_storeu_ps(o + (h0 + h) * hd + c + 8 * t, acc[h][t]);
    }
  }
}

void axpy_avx2(float a, const float* x, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

void scale_avx2(float a, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(av, _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] *= a;
}

float sum_sq_avx2(const float* x, int64_t n) {
  return dot_avx2(x, x, n);
}

void scale_mul_avx2(const float* x, float s, const float* w, float* out, int64_t n) {
  const __m256 sv = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sv), _mm256_loadu_ps(w + i)));
  }
  for (; i < n; ++i) out[i] = (x[i] * s) * w[i];
}

void add_avx2(float* x, const float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) x[i] += y[i];
}

void block_sums_avx2(const float* x, int64_t k, float* sums) {
  for (int64_t b = 0; b < k / 32; ++b) {
    const float* p = x + b * 32;
    const __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)),
                                   _mm256_add_ps(_mm256_loadu_ps(p + 16), _mm256_loadu_ps(p + 24)));
    sums[b] = hsum(s);
  }
}

// exp(x) for x in [-87, 88], about 2 ulp: x = n ln2 + r, |r| <= ln2/2,
// e^r by a degree-6 polynomial, times 2^n built in the exponent field.
inline __m256 exp_avx2(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 720.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  // 2^n: n in [-126, 127] after the clamp.
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

void silu_mul_avx2(const float* g, const float* u, float* out, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 neg = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 gv = _mm256_loadu_ps(g + i);
    const __m256 e = exp_avx2(_mm256_xor_ps(gv, neg));
    const __m256 s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(u + i)));
  }
  for (; i < n; ++i) out[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
}

// F16C conversion is exact (every fp16 value is an fp32 value); BF16 is the
// high half of an fp32.
void widen_f16_avx2(const uint16_t* src, int64_t stride, int64_t rows, int64_t len, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* s = src + r * stride;
    float* d = dst + r * len;
    int64_t i = 0;
    for (; i + 8 <= len; i += 8)
      _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i))));
    for (; i < len; ++i) d[i] = half_to_float(s[i]);
  }
}

void widen_bf16_avx2(const uint16_t* src, int64_t stride, int64_t rows, int64_t len, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const uint16_t* s = src + r * stride;
    float* d = dst + r * len;
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) {
      const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), _mm256_slli_epi32(w, 16));
    }
    for (; i < len; ++i) {
      const uint32_t bits = static_cast<uint32_t>(s[i]) << 16;
      std::memcpy(d + i, &bits, 4);
    }
  }
}

float exp_sub_sum_avx2(float* s, int64_t n, float max) {
  const __m256 mv = _mm256_set1_ps(max);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));
    _mm256_storeu_ps(s + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = hsum(acc);
  for (; i < n; ++i) {
    s[i] = std::exp(s[i] - max);
    sum += s[i];
  }
  return sum;
}

CpuKernels make_avx2() {
  CpuKernels t;
  t.isa = "avx2";
  auto set = [&t](WeightFormat f, GemvFn g, DequantRowsFn d) {
    t.gemv[static_cast<int>(f)] = g;
    t.dequant[static_cast<int>(f)] = d;
  };
  set(WeightFormat::kF32, gemv_avx2<WeightFormat::kF32>, dequant_rows_avx2<WeightFormat::kF32>);
  set(WeightFormat::kF16, gemv_avx2<WeightFormat::kF16>, dequant_rows_avx2<WeightFormat::kF16>);
  set(WeightFormat::kBF16, gemv_avx2<WeightFormat::kBF16>, dequant_rows_avx2<WeightFormat::kBF16>);
  set(WeightFormat::kQ8_0, gemv_avx2<WeightFormat::kQ8_0>, dequant_rows_avx2<WeightFormat::kQ8_0>);
  set(WeightFormat::kQ4_0, gemv_avx2<WeightFormat::kQ4_0>, dequant_rows_avx2<WeightFormat::kQ4_0>);
  set(WeightFormat::kQ4_1, gemv_avx2<WeightFormat::kQ4_1>, dequant_rows_avx2<WeightFormat::kQ4_1>);
  t.panel_gemm = panel_gemm_avx2;
  t.dot = dot_avx2;
  t.axpy = axpy_avx2;
  t.scale = scale_avx2;
  t.sum_sq = sum_sq_avx2;
  t.scale_mul = scale_mul_avx2;
  t.add = add_avx2;
  t.block_sums = block_sums_avx2;
  t.silu_mul = silu_mul_avx2;
  t.exp_sub_sum = exp_sub_sum_avx2;
  t.attn_scores = attn_scores_avx2;
  t.attn_accum = attn_accum_avx2;
  t.widen_f16 = widen_f16_avx2;
  t.widen_bf16 = widen_bf16_avx2;
  return t;
}

}  // namespace

// Called only after the CPU check in cpu_kernels_scalar.cpp.
const CpuKernels& avx2_kernels_unchecked() {
  static const CpuKernels k = make_avx2();
  return k;
}

}  // namespace osprey::cpu

#endif  // defined(__x86_64__)
