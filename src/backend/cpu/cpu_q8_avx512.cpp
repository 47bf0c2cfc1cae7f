// AVX-512 VNNI kernels of the 8-bit activation path (cpu_q8.h). Compiled
// with the default flags: every function here carries a target attribute
// and the table is handed out only after a run-time CPU check
// (cpu_q8_scalar.cpp).
//
// Same panel scheme and fp32 arithmetic as the AVX2 kernels, with the integer
// dot products done by vpdpbusd (u8 x s8, four products summed into each
// int32 lane) on 256-bit vectors, and a micro-tile of 2 weight rows x 4
// activation rows (16 int32 + 8 fp32 accumulators of the 32 registers).
// Q8_0 weights are made unsigned by flipping their sign bit (w + 128); the
// activation row's per-block bias (-128 * sum(qx)) starts each block's
// integer sum, so the sums are exact and equal to the AVX2 / scalar ones.
#include "backend/cpu/cpu_q8.h"

#if defined(__x86_64__)

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>

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

// R unpacked weight rows (w + r * lw) x C activation rows (x + c * lx):
// out[c * ldo + r].
template <int R, int C, bool kXor, bool kMin>
OSP_VNNI_INLINE void tile_vnni(const uint8_t* w, int64_t lw, const uint8_t* x, int64_t lx, int64_t ng, int tail,
                               float* out, int64_t ldo) {
  const int64_t d_off = ng * 256, s_off = d_off + ng * 32, b_off = s_off + ng * 32;
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t g = 0; g < ng; ++g) {
    __m256i dp[R][C];
    for (int c = 0; c < C; ++c) {
      const __m256i b = _mm256_load_si256(reinterpret_cast<const __m256i*>(x + c * lx + b_off + g * 32));
      for (int r = 0; r < R; ++r) dp[r][c] = b;
    }
    const int nv = g + 1 < ng ? 8 : tail;  // vectors of this group (cpu_q8.h)
    for (int t = 0; t < nv; ++t) {
      __m256i wv[R];
      for (int r = 0; r < R; ++r) {
        wv[r] = _mm256_load_si256(reinterpret_cast<const __m256i*>(w + r * lw + g * 256 + t * 32));
        if constexpr (kXor) wv[r] = _mm256_xor_si256(wv[r], flip);
      }
      for (int c = 0; c < C; ++c) {
        const __m256i xv = _mm256_load_si256(reinterpret_cast<const __m256i*>(x + c * lx + g * 256 + t * 32));
        for (int r = 0; r < R; ++r) dp[r][c] = _mm256_dpbusd_epi32(dp[r][c], wv[r], xv);
      }
    }
    __m256 dwv[R];
    for (int r = 0; r < R; ++r) dwv[r] = _mm256_load_ps(reinterpret_cast<const float*>(w + r * lw + d_off) + g * 8);
    for (int c = 0; c < C; ++c) {
      const __m256 dxv = _mm256_load_ps(reinterpret_cast<const float*>(x + c * lx + d_off) + g * 8);
      for (int r = 0; r < R; ++r)
        acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dp[r][c]), _mm256_mul_ps(dwv[r], dxv), acc[r][c]);
    }
    if constexpr (kMin) {
      __m256 mwv[R];
      for (int r = 0; r < R; ++r)
        mwv[r] = _mm256_load_ps(reinterpret_cast<const float*>(w + r * lw + d_off) + ng * 8 + g * 8);
      for (int c = 0; c < C; ++c) {
        const __m256 sxv = _mm256_load_ps(reinterpret_cast<const float*>(x + c * lx + s_off) + g * 8);
        for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(mwv[r], sxv, acc[r][c]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[c * ldo + r] = hsum8(acc[r][c]);
}

template <int R, bool kXor, bool kMin>
OSP_VNNI_INLINE void rows_vnni(const uint8_t* w, int64_t lw, const uint8_t* xq, int64_t lx, int n, int64_t ng,
                               int tail, float* out, int64_t ldo) {
  int i = 0;
  for (; i + 4 <= n; i += 4) tile_vnni<R, 4, kXor, kMin>(w, lw, xq + i * lx, lx, ng, tail, out + i * ldo, ldo);
  const uint8_t* xi = xq + i * lx;
  float* oi = out + i * ldo;
  switch (n - i) {
    case 3:
      tile_vnni<R, 3, kXor, kMin>(w, lw, xi, lx, ng, tail, oi, ldo);
      break;
    case 2:
      tile_vnni<R, 2, kXor, kMin>(w, lw, xi, lx, ng, tail, oi, ldo);
      break;
    case 1:
      tile_vnni<R, 1, kXor, kMin>(w, lw, xi, lx, ng, tail, oi, ldo);
      break;
    default:
      break;
  }
}

template <bool kXor, bool kMin>
OSP_VNNI void panel_vnni(const uint8_t* panel, int rows, int64_t lw, const uint8_t* xq, int64_t lx, int n,
                         int64_t ng, int tail, float* out, int64_t ldo) {
  int j = 0;
  for (; j + 2 <= rows; j += 2) rows_vnni<2, kXor, kMin>(panel + j * lw, lw, xq, lx, n, ng, tail, out + j, ldo);
  if (j < rows) rows_vnni<1, kXor, kMin>(panel + j * lw, lw, xq, lx, n, ng, tail, out + j, ldo);
}

OSP_VNNI void q8_gemm_vnni(const void* w, int64_t w_row_bytes, WeightFormat f, int64_t k, const uint8_t* xq,
                           int64_t xq_row_bytes, int n, float* out, int64_t ldo, int64_t r0, int64_t r1,
                           uint8_t* scratch) {
  const int64_t ng = q8_num_groups(k);
  const int64_t wrb = q8_weight_row_bytes(k);
  const int tail = q8_tail_vectors(k);
  for (int64_t p = r0; p < r1; p += kQ8PanelRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kQ8PanelRows, r1 - p));
    q8_unpack_rows_avx2(static_cast<const uint8_t*>(w) + p * w_row_bytes, w_row_bytes, f, k, rows, scratch);
    float* o = out + p;
    if (f == WeightFormat::kQ8_0) {
      panel_vnni<true, false>(scratch, rows, wrb, xq, xq_row_bytes, n, ng, tail, o, ldo);
    } else if (f == WeightFormat::kQ4_0) {
      panel_vnni<false, false>(scratch, rows, wrb, xq, xq_row_bytes, n, ng, tail, o, ldo);
    } else {
      panel_vnni<false, true>(scratch, rows, wrb, xq, xq_row_bytes, n, ng, tail, o, ldo);
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
