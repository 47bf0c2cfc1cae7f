// AVX2 kernels of the 8-bit activation path (cpu_q8.h). This file is
// compiled with -mavx2 -mfma -mf16c and only called after a run-time CPU
// check; it calls no header inline function (the linker could keep this
// file's AVX copy for callers on CPUs without AVX), hence the local copies of
// the layout arithmetic below.
//
// GEMM: weight rows are unpacked kQ8PanelRows at a time into the group
// layout (4-bit values widened to bytes, 8 blocks transposed so that int32
// lane L of a dot product belongs to block L), then every activation row is
// multiplied against each unpacked row: u8 x s8 products with maddubs (pairs
// to int16) and madd (pairs to int32), exact. Q8_0 weights are signed: |w|
// times sign(x, w). Per group of 8 blocks and per output:
//   acc = fma(float(isum[8]), dw[8] * dx[8], acc);  Q4_1: acc = fma(mw[8], sx[8], acc)
// and the output is the sum of acc's 8 lanes in a fixed order.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "backend/cpu/cpu_q8.h"

#if defined(__x86_64__)

namespace osprey::cpu {
namespace {

// Local copies of cpu_q8.h's layout (see the file comment).
int64_t groups_of(int64_t k) {
  return (k + 255) / 256;
}
int64_t weight_row_bytes(int64_t k) {
  return groups_of(k) * (256 + 64);
}
int tail_vectors(int64_t k) {
  const int64_t g = (k / 32) % 8;
  return g == 0 ? 8 : g == 1 ? 1 : g == 2 ? 2 : g <= 4 ? 4 : 8;
}

float half_to_float(uint16_t h) {
  return _cvtsh_ss(h);
}

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

inline int32_t hsum_epi32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// Bit-identical to q8_quantize_scalar: max |x| is exact, x * (127 / amax) is
// one fp32 product, rounded to nearest even.
void q8_quantize_avx2(const float* x, int64_t k, int32_t act_bias, uint8_t* dst) {
  const int64_t nb = k / 32;
  const int64_t ng = groups_of(k);
  const int tail_lanes = 8 / tail_vectors(k);  // lanes per block in the last group
  auto* d = reinterpret_cast<float*>(dst + ng * 256);
  auto* s = d + ng * 8;
  auto* bias = reinterpret_cast<int32_t*>(s + ng * 8);
  std::memset(dst + (ng - 1) * 256, 0, 256);
  for (int64_t l = (ng - 1) * 8; l < ng * 8; ++l) {
    d[l] = 0.0f;
    s[l] = 0.0f;
    bias[l] = 0;
  }
  const __m256 sign = _mm256_set1_ps(-0.0f);
  // packs_epi32 + packs_epi16 leave the 4-element groups t in dword order
  // 0 2 4 6 1 3 5 7; this permutation restores 0..7.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  alignas(32) int32_t packed[8];
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * 32;
    const __m256 v0 = _mm256_loadu_ps(xb), v1 = _mm256_loadu_ps(xb + 8);
    const __m256 v2 = _mm256_loadu_ps(xb + 16), v3 = _mm256_loadu_ps(xb + 24);
    const __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                   _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    const float db = amax / 127.0f;
    const __m256 id = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m256i q0 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v0, id), kRound));
    const __m256i q1 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v1, id), kRound));
    const __m256i q2 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v2, id), kRound));
    const __m256i q3 = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v3, id), kRound));
    const int32_t isum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3)));
    const __m256i p =
        _mm256_permutevar8x32_epi32(_mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3)), order);
    _mm256_store_si256(reinterpret_cast<__m256i*>(packed), p);
    const int lanes = b / 8 + 1 < ng ? 1 : tail_lanes;  // lanes of this block
    const int64_t beta = b % 8;
    uint8_t* base = dst + (b / 8) * 256 + beta * lanes * 4;
    for (int u = 0; u < 8; ++u) std::memcpy(base + (u / lanes) * 32 + (u % lanes) * 4, &packed[u], 4);
    const int64_t lane = (b / 8) * 8 + beta * lanes;
    for (int l = 0; l < lanes; ++l) {
      d[lane + l] = db;
      s[lane + l] = db * static_cast<float>(isum);
      bias[lane + l] = l == 0 ? -act_bias * isum : 0;
    }
  }
}

alignas(32) const uint8_t kZeroBlock[64] = {};

// 8 blocks of 32 int8 (rows r[L]) -> out[t] = dword t of every block (lane L).
inline void transpose8x8_epi32(const __m256i r[8], __m256i out[8]) {
  const __m256i a0 = _mm256_unpacklo_epi32(r[0], r[1]), a1 = _mm256_unpackhi_epi32(r[0], r[1]);
  const __m256i a2 = _mm256_unpacklo_epi32(r[2], r[3]), a3 = _mm256_unpackhi_epi32(r[2], r[3]);
  const __m256i a4 = _mm256_unpacklo_epi32(r[4], r[5]), a5 = _mm256_unpackhi_epi32(r[4], r[5]);
  const __m256i a6 = _mm256_unpacklo_epi32(r[6], r[7]), a7 = _mm256_unpackhi_epi32(r[6], r[7]);
  const __m256i b0 = _mm256_unpacklo_epi64(a0, a2), b1 = _mm256_unpackhi_epi64(a0, a2);
  const __m256i b2 = _mm256_unpacklo_epi64(a1, a3), b3 = _mm256_unpackhi_epi64(a1, a3);
  const __m256i b4 = _mm256_unpacklo_epi64(a4, a6), b5 = _mm256_unpackhi_epi64(a4, a6);
  const __m256i b6 = _mm256_unpacklo_epi64(a5, a7), b7 = _mm256_unpackhi_epi64(a5, a7);
  out[0] = _mm256_permute2x128_si256(b0, b4, 0x20);
  out[4] = _mm256_permute2x128_si256(b0, b4, 0x31);
  out[1] = _mm256_permute2x128_si256(b1, b5, 0x20);
  out[5] = _mm256_permute2x128_si256(b1, b5, 0x31);
  out[2] = _mm256_permute2x128_si256(b2, b6, 0x20);
  out[6] = _mm256_permute2x128_si256(b2, b6, 0x31);
  out[3] = _mm256_permute2x128_si256(b3, b7, 0x20);
  out[7] = _mm256_permute2x128_si256(b3, b7, 0x31);
}

}  // namespace

void q8_unpack_rows_avx2(const void* w, int64_t w_row_bytes, WeightFormat f, int64_t k, int rows, uint8_t* dst,
                         bool interleave_pairs) {
  const int64_t nb = k / 32;
  const int64_t ng = groups_of(k);
  const int64_t wrb = weight_row_bytes(k);
  const bool q8 = f == WeightFormat::kQ8_0;
  const int64_t bs = q8 ? 34 : f == WeightFormat::kQ4_0 ? 18 : 20;  // block bytes
  const int64_t qoff = f == WeightFormat::kQ4_1 ? 4 : 2;             // offset of qs in a block
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m128i low4x = _mm_set1_epi8(0x0f);
  const int tail = tail_vectors(k);
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = static_cast<const uint8_t*>(w) + r * w_row_bytes;
    // 32-byte vector v of this row (cpu_q8.h: v < 8 ng values, 8 ng + g the
    // scales dw of group g, 9 ng + g the minimums mw): row-major, or with
    // rows 2i and 2i + 1 interleaved vector by vector.
    uint8_t* const o = interleave_pairs ? dst + (r / 2) * 2 * wrb + (r % 2) * 32 : dst + r * wrb;
    const int64_t vs = interleave_pairs ? 64 : 32;  // vector stride
    auto vec = [&](int64_t v) { return reinterpret_cast<__m256i*>(o + v * vs); };
    for (int64_t g = 0; g < ng; ++g) {
      const int64_t b0 = g * 8;
      auto qs_of = [&](int64_t b) { return b < nb ? row + b * bs + qoff : kZeroBlock; };
      auto* dwg = reinterpret_cast<float*>(vec(ng * 8 + g));
      auto* mwg = reinterpret_cast<float*>(vec(ng * 9 + g));
      auto store = [&](int t, __m256i v) { _mm256_store_si256(vec(b0 + t), v); };
      const int nv = g + 1 < ng ? 8 : tail;  // vectors (stored blocks) of this group
      if (nv < 8) {
        // Short last group (cpu_q8.h): block beta spans 8 / nv lanes.
        auto ld128 = [&](int64_t b) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs_of(b))); };
        auto ld256 = [&](int64_t b) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs_of(b))); };
        if (q8) {
          if (nv == 1) {
            store(0, ld256(b0));
          } else if (nv == 2) {
            const __m256i x0 = ld256(b0), x1 = ld256(b0 + 1);
            store(0, _mm256_permute2x128_si256(x0, x1, 0x20));
            store(1, _mm256_permute2x128_si256(x0, x1, 0x31));
          } else {
            const __m256i x0 = ld256(b0), x1 = ld256(b0 + 1), x2 = ld256(b0 + 2), x3 = ld256(b0 + 3);
            const __m256i lo01 = _mm256_unpacklo_epi64(x0, x1), hi01 = _mm256_unpackhi_epi64(x0, x1);
            const __m256i lo23 = _mm256_unpacklo_epi64(x2, x3), hi23 = _mm256_unpackhi_epi64(x2, x3);
            store(0, _mm256_permute2x128_si256(lo01, lo23, 0x20));
            store(1, _mm256_permute2x128_si256(hi01, hi23, 0x20));
            store(2, _mm256_permute2x128_si256(lo01, lo23, 0x31));
            store(3, _mm256_permute2x128_si256(hi01, hi23, 0x31));
          }
        } else if (nv == 1) {
          const __m128i q = ld128(b0);
          store(0, _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), low4x), _mm_and_si128(q, low4x)));
        } else if (nv == 2) {
          const __m256i q = _mm256_set_m128i(ld128(b0 + 1), ld128(b0));
          store(0, _mm256_and_si256(q, low4));
          store(1, _mm256_and_si256(_mm256_srli_epi16(q, 4), low4));
        } else {
          const __m256i a = _mm256_set_m128i(ld128(b0 + 2), ld128(b0));
          const __m256i c = _mm256_set_m128i(ld128(b0 + 3), ld128(b0 + 1));
          const __m256i q0 = _mm256_unpacklo_epi64(a, c), q1 = _mm256_unpackhi_epi64(a, c);
          store(0, _mm256_and_si256(q0, low4));
          store(1, _mm256_and_si256(q1, low4));
          store(2, _mm256_and_si256(_mm256_srli_epi16(q0, 4), low4));
          store(3, _mm256_and_si256(_mm256_srli_epi16(q1, 4), low4));
        }
      } else if (q8) {
        __m256i in[8], out[8];
        for (int L = 0; L < 8; ++L) in[L] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs_of(b0 + L)));
        transpose8x8_epi32(in, out);
        for (int t = 0; t < 8; ++t) store(t, out[t]);
      } else {
        // p[L] = [qs of block L | qs of block L + 4]; a 4x4 dword transpose in
        // each 128-bit half gives v[t] = dword t of the 8 blocks' qs, whose
        // low nibbles are elements 4t..4t+3 and high nibbles 16+4t..16+4t+3.
        __m256i p[4];
        for (int L = 0; L < 4; ++L) {
          p[L] = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs_of(b0 + L + 4))),
                                  _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs_of(b0 + L))));
        }
        const __m256i t0 = _mm256_unpacklo_epi32(p[0], p[1]), t1 = _mm256_unpackhi_epi32(p[0], p[1]);
        const __m256i t2 = _mm256_unpacklo_epi32(p[2], p[3]), t3 = _mm256_unpackhi_epi32(p[2], p[3]);
        const __m256i v[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
                              _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)};
        for (int t = 0; t < 4; ++t) {
          store(t, _mm256_and_si256(v[t], low4));
          store(t + 4, _mm256_and_si256(_mm256_srli_epi16(v[t], 4), low4));
        }
      }
      if (nv == 8 && b0 + 8 <= nb) {
        // Full group: gather the 8 blocks' leading 4 bytes (d, then m for
        // Q4_1) and convert the fp16 halves together (exact, as _cvtsh_ss).
        const __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                               _mm256_set1_epi32(static_cast<int>(bs)));
        const __m256i g4 = _mm256_i32gather_epi32(reinterpret_cast<const int*>(row + b0 * bs), idx, 1);
        const __m256i lo = _mm256_and_si256(g4, _mm256_set1_epi32(0xffff));
        const __m256i hi = _mm256_srli_epi32(g4, 16);
        // packus: [lo 0-3, hi 0-3 | lo 4-7, hi 4-7] -> qwords 0 2 1 3: [lo 0-7 | hi 0-7].
        const __m256i dm = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xd8);
        _mm256_store_ps(dwg, _mm256_cvtph_ps(_mm256_castsi256_si128(dm)));
        _mm256_store_ps(mwg, f == WeightFormat::kQ4_1 ? _mm256_cvtph_ps(_mm256_extracti128_si256(dm, 1))
                                                          : _mm256_setzero_ps());
        continue;
      }
      const int p = 8 / nv;  // lanes per block
      for (int l = 0; l < 8; ++l) {
        const int64_t b = b0 + l / p;
        float dv = 0.0f, mv = 0.0f;
        if (b < nb) {
          uint16_t h[2];
          std::memcpy(h, row + b * bs, 4);
          dv = half_to_float(h[0]);
          if (f == WeightFormat::kQ4_1 && l % p == 0) mv = half_to_float(h[1]);
        }
        dwg[l] = dv;
        mwg[l] = mv;
      }
    }
  }
}

namespace {

// One unpacked weight row (wr) against C activation rows x + c * lx.
template <int C, bool kSigned, bool kMin>
inline void tile_avx2(const uint8_t* wr, const uint8_t* x, int64_t lx, int64_t ng, int tail, float* out,
                      int64_t ldo) {
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t d_off = ng * 256, s_off = d_off + ng * 32, b_off = s_off + ng * 32;
  const float* dw = reinterpret_cast<const float*>(wr + d_off);
  const float* mw = dw + ng * 8;
  __m256 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
  for (int64_t g = 0; g < ng; ++g) {
    __m256i dp[C];
    for (int c = 0; c < C; ++c)
      dp[c] = _mm256_load_si256(reinterpret_cast<const __m256i*>(x + c * lx + b_off + g * 32));
    const auto* wg = reinterpret_cast<const __m256i*>(wr + g * 256);
    const int nv = g + 1 < ng ? 8 : tail;
    for (int t = 0; t < nv; ++t) {
      const __m256i wv = _mm256_load_si256(wg + t);
      if constexpr (kSigned) {
        const __m256i ua = _mm256_abs_epi8(wv);
        for (int c = 0; c < C; ++c) {
          const __m256i xv = _mm256_load_si256(reinterpret_cast<const __m256i*>(x + c * lx + g * 256 + t * 32));
          dp[c] = _mm256_add_epi32(dp[c], _mm256_madd_epi16(_mm256_maddubs_epi16(ua, _mm256_sign_epi8(xv, wv)), ones));
        }
      } else {
        for (int c = 0; c < C; ++c) {
          const __m256i xv = _mm256_load_si256(reinterpret_cast<const __m256i*>(x + c * lx + g * 256 + t * 32));
          dp[c] = _mm256_add_epi32(dp[c], _mm256_madd_epi16(_mm256_maddubs_epi16(wv, xv), ones));
        }
      }
    }
    const __m256 dwv = _mm256_load_ps(dw + g * 8);
    for (int c = 0; c < C; ++c) {
      const __m256 dxv = _mm256_load_ps(reinterpret_cast<const float*>(x + c * lx + d_off) + g * 8);
      acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dp[c]), _mm256_mul_ps(dwv, dxv), acc[c]);
    }
    if constexpr (kMin) {
      const __m256 mwv = _mm256_load_ps(mw + g * 8);
      for (int c = 0; c < C; ++c) {
        const __m256 sxv = _mm256_load_ps(reinterpret_cast<const float*>(x + c * lx + s_off) + g * 8);
        acc[c] = _mm256_fmadd_ps(mwv, sxv, acc[c]);
      }
    }
  }
  for (int c = 0; c < C; ++c) out[c * ldo] = hsum(acc[c]);
}

template <bool kSigned, bool kMin>
void rows_avx2(const uint8_t* panel, int rows, int64_t wrb, const uint8_t* xq, int64_t lx, int n, int64_t ng,
               int tail, float* out, int64_t ldo) {
  for (int j = 0; j < rows; ++j) {
    const uint8_t* wr = panel + j * wrb;
    int i = 0;
    for (; i + 4 <= n; i += 4) tile_avx2<4, kSigned, kMin>(wr, xq + i * lx, lx, ng, tail, out + i * ldo + j, ldo);
    const uint8_t* xi = xq + i * lx;
    float* oi = out + i * ldo + j;
    switch (n - i) {
      case 3:
        tile_avx2<3, kSigned, kMin>(wr, xi, lx, ng, tail, oi, ldo);
        break;
      case 2:
        tile_avx2<2, kSigned, kMin>(wr, xi, lx, ng, tail, oi, ldo);
        break;
      case 1:
        tile_avx2<1, kSigned, kMin>(wr, xi, lx, ng, tail, oi, ldo);
        break;
      default:
        break;
    }
  }
}

void q8_gemm_avx2(const void* w, int64_t w_row_bytes, WeightFormat f, int64_t k, const uint8_t* xq,
                  int64_t xq_row_bytes, int n, float* out, int64_t ldo, int64_t r0, int64_t r1, uint8_t* scratch) {
  const int64_t ng = groups_of(k);
  const int64_t wrb = weight_row_bytes(k);
  const int tail = tail_vectors(k);
  for (int64_t p = r0; p < r1; p += kQ8PanelRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kQ8PanelRows, r1 - p));
    q8_unpack_rows_avx2(static_cast<const uint8_t*>(w) + p * w_row_bytes, w_row_bytes, f, k, rows, scratch, false);
    float* o = out + p;
    if (f == WeightFormat::kQ8_0) {
      rows_avx2<true, false>(scratch, rows, wrb, xq, xq_row_bytes, n, ng, tail, o, ldo);
    } else if (f == WeightFormat::kQ4_0) {
      rows_avx2<false, false>(scratch, rows, wrb, xq, xq_row_bytes, n, ng, tail, o, ldo);
    } else {
      rows_avx2<false, true>(scratch, rows, wrb, xq, xq_row_bytes, n, ng, tail, o, ldo);
    }
  }
}

Q8Kernels make_q8_avx2() {
  Q8Kernels t;
  t.isa = "avx2";
  t.quantize = q8_quantize_avx2;
  t.gemm = q8_gemm_avx2;
  t.act_bias[static_cast<int>(WeightFormat::kQ4_0)] = 8;  // sum((q - 8) x) = sum(q x) - 8 sum(x)
  return t;
}

}  // namespace

const Q8Kernels& q8_avx2_kernels_unchecked() {
  static const Q8Kernels k = make_q8_avx2();
  return k;
}

}  // namespace osprey::cpu

#endif  // defined(__x86_64__)
