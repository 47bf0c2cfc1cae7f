// AVX-512 (F/BW/VL/DQ) GEMV kernels for the quantised formats, the decode hot
// path. This file is compiled with the default flags: every function that
// uses AVX-512 carries a target attribute, and the table is handed out only
// after a run-time CPU check (cpu_kernels_scalar.cpp), so no AVX-512
// instruction can leak into code that runs elsewhere.
//
// Same maths as the AVX2 kernels: one 32-weight block is two 16-lane fp32
// vectors; d * sum(q * x) per block, plus m * sum(x) for Q4_1.
#include "backend/cpu/cpu_kernels.h"

#if defined(__x86_64__)

// GCC 12 reports false "may be used uninitialized" inside avx512fintrin.h.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#define OSP_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define OSP_AVX512_INLINE \
  inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

namespace osprey::cpu {
namespace {

OSP_AVX512_INLINE float half_to_float(uint16_t h) {
  return _cvtsh_ss(h);
}

// Q4 block (16 bytes of nibbles) -> elements 0-15 and 16-31 as fp32.
OSP_AVX512_INLINE void q4_to_f32(const uint8_t* qs, __m512& lo, __m512& hi) {
  const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  lo = _mm512_cvtepi32_ps(_mm512_and_si512(b, _mm512_set1_epi32(0x0f)));
  hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4));
}

OSP_AVX512_INLINE __m512 dot32(__m512 lo, __m512 hi, const float* x) {
  return _mm512_fmadd_ps(hi, _mm512_loadu_ps(x + 16), _mm512_mul_ps(lo, _mm512_loadu_ps(x)));
}

template <int N>
OSP_AVX512_INLINE void q4_1_n(const uint8_t* row, int64_t nb, const float* x, int64_t ldx, const float* xsum,
                              float* res) {
  const auto* b = reinterpret_cast<const BlockQ4_1*>(row);
  __m512 acc[N];
  __m128 macc[N];
  for (int i = 0; i < N; ++i) {
    acc[i] = _mm512_setzero_ps();
    macc[i] = _mm_setzero_ps();
  }
  for (int64_t j = 0; j < nb; ++j) {
    __m512 lo, hi;
    q4_to_f32(b[j].qs, lo, hi);
    // d and m are adjacent fp16 values: convert both at once.
    int32_t dm_bits;
    std::memcpy(&dm_bits, &b[j].d, 4);
    const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(dm_bits));
    const __m512 d = _mm512_broadcastss_ps(dm);
    const __m128 m = _mm_movehdup_ps(dm);
    for (int i = 0; i < N; ++i) {
      acc[i] = _mm512_fmadd_ps(d, dot32(lo, hi, x + i * ldx + j * 32), acc[i]);
      macc[i] = _mm_fmadd_ss(m, _mm_load_ss(xsum + i * nb + j), macc[i]);
    }
  }
  for (int i = 0; i < N; ++i) res[i] = _mm512_reduce_add_ps(acc[i]) + _mm_cvtss_f32(macc[i]);
}

template <int N>
OSP_AVX512_INLINE void q4_0_n(const uint8_t* row, int64_t nb, const float* x, int64_t ldx, float* res) {
  const auto* b = reinterpret_cast<const BlockQ4_0*>(row);
  const __m512 eight = _mm512_set1_ps(8.0f);
  __m512 acc[N];
  for (int i = 0; i < N; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t j = 0; j < nb; ++j) {
    __m512 lo, hi;
    q4_to_f32(b[j].qs, lo, hi);
    lo = _mm512_sub_ps(lo, eight);
    hi = _mm512_sub_ps(hi, eight);
    const __m512 d = _mm512_set1_ps(half_to_float(b[j].d));
    for (int i = 0; i < N; ++i) acc[i] = _mm512_fmadd_ps(d, dot32(lo, hi, x + i * ldx + j * 32), acc[i]);
  }
  for (int i = 0; i < N; ++i) res[i] = _mm512_reduce_add_ps(acc[i]);
}

template <int N>
OSP_AVX512_INLINE void q8_0_n(const uint8_t* row, int64_t nb, const float* x, int64_t ldx, float* res) {
  const auto* b = reinterpret_cast<const BlockQ8_0*>(row);
  __m512 acc[N];
  for (int i = 0; i < N; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t j = 0; j < nb; ++j) {
    const __m512 lo =
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[j].qs))));
    const __m512 hi =
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[j].qs + 16))));
    const __m512 d = _mm512_set1_ps(half_to_float(b[j].d));
    for (int i = 0; i < N; ++i) acc[i] = _mm512_fmadd_ps(d, dot32(lo, hi, x + i * ldx + j * 32), acc[i]);
  }
  for (int i = 0; i < N; ++i) res[i] = _mm512_reduce_add_ps(acc[i]);
}

template <WeightFormat F, int N>
OSP_AVX512_INLINE void row_n(const uint8_t* row, int64_t nb, const float* x, int64_t ldx, const float* xsum,
                             float* res) {
  if constexpr (F == WeightFormat::kQ4_1) {
    q4_1_n<N>(row, nb, x, ldx, xsum, res);
  } else if constexpr (F == WeightFormat::kQ4_0) {
    q4_0_n<N>(row, nb, x, ldx, res);
  } else {
    q8_0_n<N>(row, nb, x, ldx, res);
  }
}

template <WeightFormat F>
OSP_AVX512 void gemv_avx512(const void* w, int64_t w_row_bytes, int64_t k, const float* x, int64_t ldx,
                            const float* xsum, int n, float* out, int64_t ldo, int64_t r0, int64_t r1) {
  const int64_t nb = k / 32;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = static_cast<const uint8_t*>(w) + r * w_row_bytes;
    int i = 0;
    float res[4];
    for (; i + 4 <= n; i += 4) {
      row_n<F, 4>(row, nb, x + i * ldx, ldx, xsum ? xsum + i * nb : nullptr, res);
      for (int t = 0; t < 4; ++t) out[(i + t) * ldo + r] = res[t];
    }
    const float* xs = xsum ? xsum + i * nb : nullptr;
    switch (n - i) {
      case 3:
        row_n<F, 3>(row, nb, x + i * ldx, ldx, xs, res);
        break;
      case 2:
        row_n<F, 2>(row, nb, x + i * ldx, ldx, xs, res);
        break;
      case 1:
        row_n<F, 1>(row, nb, x + i * ldx, ldx, xs, res);
        break;
      default:
        break;
    }
    for (int t = 0; t < n - i; ++t) out[(i + t) * ldo + r] = res[t];
  }
}

// ---- panel GEMM: RX activation rows x 4 panel rows per micro-tile, 16 lanes ----
//
// Same dot-product form as the AVX2 panel kernel, with 16-lane partial sums
// (k is a multiple of 16 here; the caller falls back otherwise). The four
// accumulators of one activation row are reduced together into one 4-float
// store, so the per-tile epilogue stays small at k = 576.

// Returns {sum(a), sum(b), sum(c), sum(d)}.
OSP_AVX512_INLINE __m128 hsum4(__m512 a, __m512 b, __m512 c, __m512 d) {
  // 16 -> 8 lanes: add the 256-bit halves.
  const __m256 a8 = _mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1));
  const __m256 b8 = _mm256_add_ps(_mm512_castps512_ps256(b), _mm512_extractf32x8_ps(b, 1));
  const __m256 c8 = _mm256_add_ps(_mm512_castps512_ps256(c), _mm512_extractf32x8_ps(c, 1));
  const __m256 d8 = _mm256_add_ps(_mm512_castps512_ps256(d), _mm512_extractf32x8_ps(d, 1));
  // Pairwise horizontal adds: lanes [a01 a23 b01 b23 | a45 a67 b45 b67] etc.
  const __m256 ab = _mm256_hadd_ps(a8, b8);
  const __m256 cd = _mm256_hadd_ps(c8, d8);
  const __m256 abcd = _mm256_hadd_ps(ab, cd);  // [a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7]
  return _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1));
}

template <int RX>
OSP_AVX512_INLINE void panel_tile4_avx512(const float* x, int64_t ldx, const float* p, int64_t k, float* out,
                                          int64_t ldo) {
  __m512 acc[RX][4];
  for (int i = 0; i < RX; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t t = 0; t < k; t += 16) {
    __m512 xv[RX];
    for (int i = 0; i < RX; ++i) xv[i] = _mm512_loadu_ps(x + i * ldx + t);
    for (int j = 0; j < 4; ++j) {
      const __m512 pv = _mm512_loadu_ps(p + j * k + t);
      for (int i = 0; i < RX; ++i) acc[i][j] = _mm512_fmadd_ps(xv[i], pv, acc[i][j]);
    }
  }
  for (int i = 0; i < RX; ++i) _mm_storeu_ps(out + i * ldo, hsum4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
}

OSP_AVX512_INLINE float dot16_tail(const float* x, const float* p, int64_t k) {
  __m512 s = _mm512_setzero_ps();
  for (int64_t t = 0; t < k; t += 16) s = _mm512_fmadd_ps(_mm512_loadu_ps(x + t), _mm512_loadu_ps(p + t), s);
  return _mm512_reduce_add_ps(s);
}

OSP_AVX512 void panel_gemm_avx512(const float* x, int64_t ldx, int n, const float* p, int m, int64_t k, float* out,
                                  int64_t ldo) {
  if (k % 16 != 0) {
    avx2_kernels_unchecked().panel_gemm(x, ldx, n, p, m, k, out, ldo);
    return;
  }
  constexpr int kRX = 6;  // 6 x 4 accumulators + 6 activation vectors + 1 panel vector of the 32 registers
  const int m4 = m / 4 * 4;
  int i = 0;
  for (; i + kRX <= n; i += kRX)
    for (int j = 0; j < m4; j += 4) panel_tile4_avx512<kRX>(x + i * ldx, ldx, p + j * k, k, out + i * ldo + j, ldo);
  for (int j = 0; j < m4; j += 4) {
    const float* xi = x + i * ldx;
    const float* pj = p + j * k;
    float* oi = out + i * ldo + j;
    switch (n - i) {
      case 5:
        panel_tile4_avx512<5>(xi, ldx, pj, k, oi, ldo);
        break;
      case 4:
        panel_tile4_avx512<4>(xi, ldx, pj, k, oi, ldo);
        break;
      case 3:
        panel_tile4_avx512<3>(xi, ldx, pj, k, oi, ldo);
        break;
      case 2:
        panel_tile4_avx512<2>(xi, ldx, pj, k, oi, ldo);
        break;
      case 1:
        panel_tile4_avx512<1>(xi, ldx, pj, k, oi, ldo);
        break;
      default:
        break;
    }
  }
  // Panel rows past the last multiple of 4 (panels of m % 4 != 0 rows).
  for (int j = m4; j < m; ++j)
    for (int r = 0; r < n; ++r) out[r * ldo + j] = dot16_tail(x + r * ldx, p + j * k, k);
}

// ---- dequantise rows to fp32 (panels) ---------------------------------------
// Bit-identical to the AVX2/scalar dequantisation: d * q (+ m) with the
// product and the sum each rounded (no fused multiply-add).

OSP_AVX512 void dequant_q4_1_avx512(const void* w, int64_t w_row_bytes, int64_t k, int64_t rows, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const auto* b = reinterpret_cast<const BlockQ4_1*>(static_cast<const uint8_t*>(w) + r * w_row_bytes);
    float* o = dst + r * k;
    for (int64_t j = 0; j < k / 32; ++j) {
      __m512 lo, hi;
      q4_to_f32(b[j].qs, lo, hi);
      int32_t dm_bits;
      std::memcpy(&dm_bits, &b[j].d, 4);
      const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(dm_bits));
      const __m512 d = _mm512_broadcastss_ps(dm);
      const __m512 m = _mm512_broadcastss_ps(_mm_movehdup_ps(dm));
      _mm512_storeu_ps(o + j * 32, _mm512_add_ps(_mm512_mul_ps(d, lo), m));
      _mm512_storeu_ps(o + j * 32 + 16, _mm512_add_ps(_mm512_mul_ps(d, hi), m));
    }
  }
}

OSP_AVX512 void dequant_q8_0_avx512(const void* w, int64_t w_row_bytes, int64_t k, int64_t rows, float* dst) {
  for (int64_t r = 0; r < rows; ++r) {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(static_cast<const uint8_t*>(w) + r * w_row_bytes);
    float* o = dst + r * k;
    for (int64_t j = 0; j < k / 32; ++j) {
      const __m512 d = _mm512_set1_ps(half_to_float(b[j].d));
      const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[j].qs))));
      const __m512 hi =
          _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[j].qs + 16))));
      _mm512_storeu_ps(o + j * 32, _mm512_mul_ps(d, lo));
      _mm512_storeu_ps(o + j * 32 + 16, _mm512_mul_ps(d, hi));
    }
  }
}

CpuKernels make_avx512() {
  CpuKernels t = avx2_kernels_unchecked();
  t.isa = "avx512";
  t.gemv[static_cast<int>(WeightFormat::kQ4_1)] = gemv_avx512<WeightFormat::kQ4_1>;
  t.gemv[static_cast<int>(WeightFormat::kQ4_0)] = gemv_avx512<WeightFormat::kQ4_0>;
  t.gemv[static_cast<int>(WeightFormat::kQ8_0)] = gemv_avx512<WeightFormat::kQ8_0>;
  t.panel_gemm = panel_gemm_avx512;
  t.dequant[static_cast<int>(WeightFormat::kQ4_1)] = dequant_q4_1_avx512;
  t.dequant[static_cast<int>(WeightFormat::kQ8_0)] = dequant_q8_0_avx512;
  return t;
}

}  // namespace

const CpuKernels& avx512_kernels_unchecked() {
  static const CpuKernels k = make_avx512();
  return k;
}

}  // namespace osprey::cpu

#pragma GCC diagnostic pop

#endif  // defined(__x86_64__)
