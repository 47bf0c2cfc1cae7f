// AVX-512 VNNI kernels of the 8-bit activation path (cpu_q8.h). Compiled
// with the default flags: every function here carries a target attribute
// and the table is handed out only after a run-time CPU check
// (cpu_q8_scalar.cpp).
//
// Same panel scheme and per-lane fp32 arithmetic as the AVX2 kernels, with
// the integer dot products done by vpdpbusd (u8 x s8, four products summed
// into each int32 lane). The panel's weight rows are unpacked in pairs,
// interleaved vector by vector, so that one 512-bit register holds the same
// 32-byte vector of two rows and one vpdpbusd multiplies both against an
// activation vector broadcast to both halves. Micro-tile: 2 pairs (4 weight
// rows) x 4 activation rows = 8 int32 + 8 fp32 512-bit accumulators. Against
// the earlier 256-bit 2 x 4 tile this halves the activation loads and
// broadcasts per multiply and reads the activations half as often; each
// 256-bit half does exactly the old tile's operations, so the outputs are
// bit-identical to it (Zen 4 runs 512-bit ops as two 256-bit halves: the gain
// is in loads and instructions, 1.25-1.4x per matrix at n = 32).
// Q8_0 weights are made unsigned by flipping their sign bit (w + 128); the
// activation row's per-block bias (-128 * sum(qx)) starts each block's
// integer sum, so the sums are exact and equal to the AVX2 / scalar ones.
#include "backend/cpu/cpu_q8.h"

#if defined(__x86_64__)

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#define OSP_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define OSP_VNNI_INLINE \
  inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))

namespace osprey::cpu {
namespace {

OSP_VNNI_INLINE float hsum8(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v);
  const __m128 hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehdup_ps(lo);
  lo = _mm_add_ps(lo, sh);
  sh = _mm_movehl_ps(sh, lo);
  lo = _mm_add_ss(lo, sh);
  return _mm_cvtss_f32(lo);
}

// P pairs of unpacked weight rows (pair p at w + p * lw, interleaved: vector
// v of its first row at 64 v, of its second at 64 v + 32) x C activation rows
// (x + c * lx): out[c * ldo + 2 p + h] for h < (the pair's rows). Each 512-bit
// accumulator holds one activation row against both rows of a pair: the low
// 256 bits are exactly the ymm accumulator of the pair's first row (same
// integer sums, same fp32 operations per lane in the same order), the high
// 256 bits that of its second row, so the result equals a 256-bit kernel's.
template <int P, int C, bool kXor, bool kMin>
OSP_VNNI_INLINE void tile_vnni(const uint8_t* w, int64_t lw, const uint8_t* x, int64_t lx, int64_t ng, int tail,
                               float* out, int64_t ldo, int last_rows) {
  const int64_t d_off = ng * 256, s_off = d_off + ng * 32, b_off = s_off + ng * 32;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[P][C];
  for (int p = 0; p < P; ++p)
    for (int c = 0; c < C; ++c) acc[p][c] = _mm512_setzero_ps();
  for (int64_t g = 0; g < ng; ++g) {
    __m512i dp[P][C];
    for (int c = 0; c < C; ++c) {
      const __m512i b =
          _mm512_broadcast_i64x4(_mm256_load_si256(reinterpret_cast<const __m256i*>(x + c * lx + b_off + g * 32)));
      for (int p = 0; p < P; ++p) dp[p][c] = b;
    }
    const int nv = g + 1 < ng ? 8 : tail;  // vectors of this group (cpu_q8.h)
    for (int t = 0; t < nv; ++t) {
      __m512i wv[P];
      for (int p = 0; p < P; ++p) {
        wv[p] = _mm512_loadu_si512(w + p * lw + (g * 8 + t) * 64);
        if constexpr (kXor) wv[p] = _mm512_xor_si512(wv[p], flip);
      }
      for (int c = 0; c < C; ++c) {
        const __m512i xv =
            _mm512_broadcast_i64x4(_mm256_load_si256(reinterpret_cast<const __m256i*>(x + c * lx + g * 256 + t * 32)));
        for (int p = 0; p < P; ++p) dp[p][c] = _mm512_dpbusd_epi32(dp[p][c], wv[p], xv);
      }
    }
    __m512 dwv[P];
    for (int p = 0; p < P; ++p) dwv[p] = _mm512_loadu_ps(w + p * lw + (ng * 8 + g) * 64);
    for (int c = 0; c < C; ++c) {
      const __m512 dxv = _mm512_castpd_ps(
          _mm512_broadcast_f64x4(_mm256_load_pd(reinterpret_cast<const double*>(x + c * lx + d_off + g * 32))));
      for (int p = 0; p < P; ++p)
        acc[p][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp[p][c]), _mm512_mul_ps(dwv[p], dxv), acc[p][c]);
    }
    if constexpr (kMin) {
      __m512 mwv[P];
      for (int p = 0; p < P; ++p) mwv[p] = _mm512_loadu_ps(w + p * lw + (ng * 9 + g) * 64);
      for (int c = 0; c < C; ++c) {
        const __m512 sxv = _mm512_castpd_ps(
            _mm512_broadcast_f64x4(_mm256_load_pd(reinterpret_cast<const double*>(x + c * lx + s_off + g * 32))));
        for (int p = 0; p < P; ++p) acc[p][c] = _mm512_fmadd_ps(mwv[p], sxv, acc[p][c]);
      }
    }
  }
  for (int p = 0; p < P; ++p) {
    const bool both = p + 1 < P || last_rows == 2;
    for (int c = 0; c < C; ++c) {
      out[c * ldo + 2 * p] = hsum8(_mm512_castps512_ps256(acc[p][c]));
      if (both) out[c * ldo + 2 * p + 1] = hsum8(_mm512_extractf32x8_ps(acc[p][c], 1));
    }
  }
}

// All n activation rows against P pairs, kC rows at a time (2 x 4 pairs x
// rows: 8 integer + 8 fp32 accumulators; 2 x 6 spills and measured slower).
template <int P, bool kXor, bool kMin>
OSP_VNNI_INLINE void rows_vnni(const uint8_t* w, int64_t lw, const uint8_t* xq, int64_t lx, int n, int64_t ng, int tail,
                               float* out, int64_t ldo, int last_rows) {
  constexpr int kC = 4;
  int i = 0;
  for (; i + kC <= n; i += kC)
    tile_vnni<P, kC, kXor, kMin>(w, lw, xq + i * lx, lx, ng, tail, out + i * ldo, ldo, last_rows);
  const uint8_t* xi = xq + i * lx;
  float* oi = out + i * ldo;
  switch (n - i) {
    case 3:
      tile_vnni<P, 3, kXor, kMin>(w, lw, xi, lx, ng, tail, oi, ldo, last_rows);
      break;
    case 2:
      tile_vnni<P, 2, kXor, kMin>(w, lw, xi, lx, ng, tail, oi, ldo, last_rows);
      break;
    case 1:
      tile_vnni<P, 1, kXor, kMin>(w, lw, xi, lx, ng, tail, oi, ldo, last_rows);
      break;
    default:
      break;
  }
}

// A panel of `rows` unpacked rows, pair-interleaved (pair stride lw = 2 rows).
template <bool kXor, bool kMin>
OSP_VNNI void panel_vnni(const uint8_t* panel, int rows, int64_t lw, const uint8_t* xq, int64_t lx, int n, int64_t ng,
                         int tail, float* out, int64_t ldo) {
  int j = 0;
  for (; j + 4 <= rows; j += 4)
    rows_vnni<2, kXor, kMin>(panel + (j / 2) * lw, lw, xq, lx, n, ng, tail, out + j, ldo, 2);
  if (j < rows)
    rows_vnni<1, kXor, kMin>(panel + (j / 2) * lw, lw, xq, lx, n, ng, tail, out + j, ldo, std::min(2, rows - j));
  if (j + 2 < rows)
    rows_vnni<1, kXor, kMin>(panel + (j / 2 + 1) * lw, lw, xq, lx, n, ng, tail, out + j + 2, ldo, rows - j - 2);
}

OSP_VNNI void q8_gemm_vnni(const void* w, int64_t w_row_bytes, WeightFormat f, int64_t k, const uint8_t* xq,
                           int64_t xq_row_bytes, int n, float* out, int64_t ldo, int64_t r0, int64_t r1,
                           uint8_t* scratch) {
  const int64_t ng = q8_num_groups(k);
  const int64_t wrb = q8_weight_row_bytes(k);
  const int tail = q8_tail_vectors(k);
  for (int64_t p = r0; p < r1; p += kQ8PanelRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kQ8PanelRows, r1 - p));
    q8_unpack_rows_avx2(static_cast<const uint8_t*>(w) + p * w_row_bytes, w_row_bytes, f, k, rows, scratch, true);
    if (rows % 2 != 0) {
      // The odd last row's partner lanes are computed and dropped: zero them
      // so that no stale bytes reach the arithmetic.
      uint8_t* partner = scratch + (rows / 2) * 2 * wrb + 32;
      for (int64_t v = 0; v < ng * 10; ++v) std::memset(partner + v * 64, 0, 32);
    }
    float* o = out + p;
    if (f == WeightFormat::kQ8_0) {
      panel_vnni<true, false>(scratch, rows, 2 * wrb, xq, xq_row_bytes, n, ng, tail, o, ldo);
    } else if (f == WeightFormat::kQ4_0) {
      panel_vnni<false, false>(scratch, rows, 2 * wrb, xq, xq_row_bytes, n, ng, tail, o, ldo);
    } else {
      panel_vnni<false, true>(scratch, rows, 2 * wrb, xq, xq_row_bytes, n, ng, tail, o, ldo);
    }
  }
}

Q8Kernels make_q8_avx512() {
  Q8Kernels t;
  t.isa = "avx512";
  t.quantize = q8_avx2_kernels_unchecked().quantize;
  t.gemm = q8_gemm_vnni;
  t.act_bias[static_cast<int>(WeightFormat::kQ8_0)] = 128;  // sum((w + 128) x) - 128 sum(x)
  t.act_bias[static_cast<int>(WeightFormat::kQ4_0)] = 8;    // sum((q - 8) x) = sum(q x) - 8 sum(x)
  return t;
}

}  // namespace

const Q8Kernels& q8_avx512_kernels_unchecked() {
  static const Q8Kernels k = make_q8_avx512();
  return k;
}

}  // namespace osprey::cpu

#pragma GCC diagnostic pop

#endif  // defined(__x86_64__)
