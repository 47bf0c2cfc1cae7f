// Portable 8-bit activation kernels (cpu_q8.h): the quantiser every table
// matches bit for bit, and a plain integer GEMM that reads the packed weights
// directly. The fallback on any CPU and the cross-check for the vector ones.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/cpu_q8.h"

namespace osprey::cpu {
namespace {

void q8_quantize_scalar(const float* x, int64_t k, int32_t act_bias, uint8_t* dst) {
  const int64_t nb = k / kQuantBlock;
  const int64_t last = q8_num_groups(k) - 1;
  auto* qs = reinterpret_cast<int8_t*>(dst);
  auto* d = reinterpret_cast<float*>(dst + q8_act_d_offset(k));
  auto* s = reinterpret_cast<float*>(dst + q8_act_s_offset(k));
  auto* bias = reinterpret_cast<int32_t*>(dst + q8_act_bias_offset(k));
  // The last group may be partly padding: zero it first.
  std::memset(qs + last * kQ8GroupElems, 0, kQ8GroupElems);
  for (int l = 0; l < kQ8GroupBlocks; ++l) {
    d[last * kQ8GroupBlocks + l] = 0.0f;
    s[last * kQ8GroupBlocks + l] = 0.0f;
    bias[last * kQ8GroupBlocks + l] = 0;
  }
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * kQuantBlock;
    float amax = 0.0f;
    for (int e = 0; e < kQuantBlock; ++e) amax = std::max(amax, std::fabs(xb[e]));
    const float db = amax / 127.0f;
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t isum = 0;
    for (int e = 0; e < kQuantBlock; ++e) {
      const int q = static_cast<int>(std::nearbyint(xb[e] * id));  // |q| <= 127
      isum += q;
      qs[q8_elem_offset(k, b, e)] = static_cast<int8_t>(q);
    }
    const int64_t lane = q8_first_lane(k, b);
    for (int l = 0; l < q8_lanes_per_block(k, b); ++l) {
      d[lane + l] = db;
      s[lane + l] = db * static_cast<float>(isum);
      bias[lane + l] = l == 0 ? -act_bias * isum : 0;
    }
  }
}

// Signed integer weight values of block b of a row, and its scale / minimum.
inline void weight_block(const void* row, WeightFormat f, int64_t b, int* q, float* dw, float* mw) {
  if (f == WeightFormat::kQ8_0) {
    const auto& blk = static_cast<const BlockQ8_0*>(row)[b];
    for (int e = 0; e < 32; ++e) q[e] = blk.qs[e];
    *dw = fp16_to_f32(blk.d);
    *mw = 0.0f;
  } else if (f == WeightFormat::kQ4_0) {
    const auto& blk = static_cast<const BlockQ4_0*>(row)[b];
    for (int e = 0; e < 16; ++e) {
      q[e] = (blk.qs[e] & 0x0f) - 8;
      q[e + 16] = (blk.qs[e] >> 4) - 8;
    }
    *dw = fp16_to_f32(blk.d);
    *mw = 0.0f;
  } else {
    const auto& blk = static_cast<const BlockQ4_1*>(row)[b];
    for (int e = 0; e < 16; ++e) {
      q[e] = blk.qs[e] & 0x0f;
      q[e + 16] = blk.qs[e] >> 4;
    }
    *dw = fp16_to_f32(blk.d);
    *mw = fp16_to_f32(blk.m);
  }
}

// Per element: acc += (dw_b * dx_b) * isum_b, then += mw_b * sx_b (Q4_1), in
// block order. act_bias is 0 for every format here (the integer sums use the
// signed weight values directly).
void q8_gemm_scalar(const void* w, int64_t w_row_bytes, WeightFormat f, int64_t k, const uint8_t* xq,
                    int64_t xq_row_bytes, int n, float* out, int64_t ldo, int64_t r0, int64_t r1,
                    uint8_t* /*scratch*/) {
  const int64_t nb = k / kQuantBlock;
  const bool has_min = f == WeightFormat::kQ4_1;
  int q[32];
  for (int64_t r = r0; r < r1; ++r) {
    const void* row = static_cast<const char*>(w) + r * w_row_bytes;
    for (int i = 0; i < n; ++i) {
      const uint8_t* xr = xq + i * xq_row_bytes;
      const auto* qs = reinterpret_cast<const int8_t*>(xr);
      const auto* d = reinterpret_cast<const float*>(xr + q8_act_d_offset(k));
      const auto* s = reinterpret_cast<const float*>(xr + q8_act_s_offset(k));
      float acc = 0.0f;
      for (int64_t b = 0; b < nb; ++b) {
        float dw, mw;
        weight_block(row, f, b, q, &dw, &mw);
        int32_t isum = 0;
        for (int e = 0; e < 32; ++e) isum += q[e] * qs[q8_elem_offset(k, b, e)];
        const int64_t lane = q8_first_lane(k, b);
        acc += (dw * d[lane]) * static_cast<float>(isum);
        if (has_min) acc += mw * s[lane];
      }
      out[i * ldo + r] = acc;
    }
  }
}

Q8Kernels make_q8_scalar() {
  Q8Kernels t;
  t.isa = "scalar";
  t.quantize = q8_quantize_scalar;
  t.gemm = q8_gemm_scalar;
  return t;
}

}  // namespace

const Q8Kernels& q8_scalar_kernels() {
  static const Q8Kernels k = make_q8_scalar();
  return k;
}

const Q8Kernels* q8_avx2_kernels() {
#if defined(__x86_64__)
  return avx2_kernels() != nullptr ? &q8_avx2_kernels_unchecked() : nullptr;
#else
  return nullptr;
#endif
}

const Q8Kernels* q8_avx512_kernels() {
#if defined(__x86_64__)
  static const bool supported = avx512_kernels() != nullptr && __builtin_cpu_supports("avx512vnni");
  return supported ? &q8_avx512_kernels_unchecked() : nullptr;
#else
  return nullptr;
#endif
}

const Q8Kernels* q8_kernels_for(const CpuKernels* fp32_kernels) {
  if (fp32_kernels == &scalar_kernels()) return &q8_scalar_kernels();
  if (fp32_kernels == avx512_kernels()) {
    if (const Q8Kernels* k = q8_avx512_kernels()) return k;
  }
  if (const Q8Kernels* k = q8_avx2_kernels()) return k;
  return &q8_scalar_kernels();
}

}  // namespace osprey::cpu
