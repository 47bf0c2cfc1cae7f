// The fused attention input of one layer: reads the fused QKV projection,
// applies the optional per-head RMSNorm (Qwen3 q/k norm) and RoPE to q and k
// in registers, writes the rotated q and puts K/V straight into the pages.
// Replaces head_rms_norm + rope + kv_write (three passes over q/k/v).
//
// Two kernels compute the same function:
//
// qkv_rope_vec_kernel (full rotary, head_dim a multiple of 16 with hd / 16 a
// power of two, 16-byte aligned tensors: every Llama/Qwen/Mistral shape): blocks (token,
// chunk of kVecThreads work items); item (head h, lane j < L = hd / 16)
// owns dims [8j, 8j + 8) and their rotation partners [hd/2 + 8j, ...), so
// each thread rotates in registers after two 16-byte loads per operand
// (32-byte for F32) and stores with 16-byte stores. The block first puts
// cos/sin of the token's hd/2 angles in shared memory (one cosf/sinf pair
// per angle per block instead of one per head). Per-head RMSNorm reduces
// over the L lanes of a head with shuffles. One pass, memory-bound.
//
// qkv_rope_kernel (anything else, e.g. partial rotary): blocks (token, group
// of 8 heads), one warp per head (q heads, then k heads, then v heads), so
// a decode step still spreads over SMs. Lane j owns dims j + 32 * c of the
// head, c < kChunks, so the rotation partners i and i + rotary_dim / 2 are
// owned by lanes of the same warp and exchanged through shared memory.
//
// Both are launched with programmatic dependent launch (pdl.cuh): they let
// the next kernel (the decode attention, which starts its K/V copies of the
// earlier positions) become resident at once, and the vec kernel computes
// its angles (positions and inv_freq: host-written) before pdl_wait; q/k/v
// are read only after it.
//
// Row scale (args.rms_x set; ops::Backend::rms_scaled_qkv_rope_kv_write):
// qkv is then the projection of the raw residual x with the RMSNorm weight
// folded into it, so each block first reduces its token's row of x to inv =
// 1 / sqrt(mean(x^2) + rms_eps) (all threads, after pdl_wait: x is written
// by the kernels before) and every q/k/v value v becomes v * inv (plus the
// projection's bias, args.qkv_bias, where set) rounded to
// the activation dtype, as a projection of the normed rows would have stored
// it, before the head norm, RoPE and the stores. With args.rms_inv set the
// factors were computed before (launch_row_inv_rms, for steps of many rows)
// and each block reads its token's. Null rms_x and rms_inv leave the
// kernels as they were.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/attention/kv_fp8.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/host_util.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/norm/row_rms.cuh"
#include "backend/cuda/pdl.cuh"

namespace osprey::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxHd = kMaxHeadDim;
constexpr int kChunks = kMaxHd / 32;

template <class T, class KvT>
__global__ void __launch_bounds__(kWarps * 32) qkv_rope_kernel(QkvRopeArgs a) {
  __shared__ float buf[kWarps][kMaxHd];
  __shared__ float red[32];
  pdl_launch_dependents();
  pdl_wait();
  const int64_t t = blockIdx.x;
  // The row scale: the whole block (32 * min(kWarps, heads) threads), before any warp skips a head.
  const bool scaled = a.rms_x || a.rms_inv;
  const float row_inv = a.rms_inv ? a.rms_inv[t]
                        : a.rms_x ? block_row_inv_rms(static_cast<const T*>(a.rms_x) + t * a.rms_d, a.rms_d, a.rms_eps, red)
                                  : 1.0f;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int hd = a.hd;
  const int heads = a.hq + 2 * a.hk;
  const T* row = static_cast<const T*>(a.qkv) + t * static_cast<int64_t>(heads) * hd;
  const int32_t slot = a.slot_mapping[t];
  const bool write_kv = slot >= 0 && slot < a.num_slots;
  const float pos = static_cast<float>(a.positions[t]);
  const int half = a.rotary_dim / 2;
  float* sb = buf[warp];

  // Block (t, y) takes heads [y * kWarps, y * kWarps + kWarps): one per warp.
  for (int h = blockIdx.y * kWarps + warp; h < min(heads, (blockIdx.y + 1) * kWarps); h += kWarps) {
    const bool is_q = h < a.hq;
    const bool is_k = !is_q && h < a.hq + a.hk;
    if (!is_q && !write_kv) continue;  // K/V of a skipped slot: nothing to write (warp-uniform)
    const T* src = row + static_cast<int64_t>(h) * hd;
    float v[kChunks];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int d = lane + 32 * c;
      v[c] = d < hd ? to_float(src[d]) : 0.0f;
    }
    if (scaled) {
      // Plus the bias, rounded to T, as the projection of the normed rows stores it (dims past hd stay 0).
      const float* b = a.qkv_bias ? a.qkv_bias + static_cast<int64_t>(h) * hd : nullptr;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int d = lane + 32 * c;
        if (d < hd) v[c] = b ? rms_scale_round<T>(v[c], row_inv, b[d]) : rms_scale_round<T>(v[c], row_inv);
      }
    }
    if (is_q || is_k) {
      const float* nw = is_q ? a.q_norm : a.k_norm;
      if (nw) {
        float ss = 0.0f;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) ss += v[c] * v[c];
        ss = warp_sum(ss);
        const float inv = 1.0f / sqrtf(ss / static_cast<float>(hd) + a.eps);
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const int d = lane + 32 * c;
          // Rounded to T, as head_rms_norm stores it before RoPE reads it.
          if (d < hd) v[c] = to_float(from_float<T>(v[c] * inv * nw[d]));
        }
      }
      // Partners through shared memory: sb[d] = v(d).
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int d = lane + 32 * c;
        if (d < hd) sb[d] = v[c];
      }
      __syncwarp();
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int d = lane + 32 * c;
        if (d < a.rotary_dim) {
          const int i = d < half ? d : d - half;
          const float angle = pos * a.inv_freq[i];
          const float cs = cosf(angle) * a.attention_scaling;
          const float sn = sinf(angle) * a.attention_scaling;
          const float x1 = sb[i];
          const float x2 = sb[i + half];
          // Each product rounded separately, as in torch (matches rope_kernel).
          v[c] = d < half ? __fmul_rn(x1, cs) - __fmul_rn(x2, sn) : __fmul_rn(x2, cs) + __fmul_rn(x1, sn);
        }
      }
      __syncwarp();  // sb is rewritten by the next head of this warp
    }
    if (is_q) {
      T* dst = static_cast<T*>(a.q_out) + (t * a.hq + h) * static_cast<int64_t>(hd);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int d = lane + 32 * c;
        if (d < hd) dst[d] = from_float<T>(v[c]);
      }
    } else {
      const int kvh = is_k ? h - a.hq : h - a.hq - a.hk;
      KvT* cache = static_cast<KvT*>(is_k ? a.k_cache : a.v_cache);
      const int64_t kv_row = static_cast<int64_t>(slot) * a.hk + kvh;
      KvT* dst = cache + kv_row * hd;
      if constexpr (kIsKvI8<KvT>) {  // the warp holds the whole row: its max gives the row's scale
        float amax = 0.0f;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          v[c] = to_float(from_float<T>(v[c]));  // dims past hd are 0
          amax = fmaxf(amax, i8_amax_term(v[c]));
        }
        const float s = i8_row_scale(warp_max(amax));
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const int d = lane + 32 * c;
          if (d < hd) dst[d] = i8_quantize(v[c], s);
        }
        if (lane == 0) (is_k ? a.k_row_scales : a.v_row_scales)[ops::kv_row_scale_index(slot, kvh, a.hk, a.block_size)] = s;
      } else {
        const float inv = is_k ? a.k_inv_scale : a.v_inv_scale;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const int d = lane + 32 * c;
          // Rounded to the activation dtype first, as if k/v had been stored and kv_write had read them.
          if (d < hd) dst[d] = kv_from_float<KvT>(to_float(from_float<T>(v[c])), inv);
        }
      }
    }
  }
}

constexpr int kVecThreads = 256;
constexpr int kVecMaxHd = kMaxHd;

template <class T, class KvT>
__global__ void __launch_bounds__(kVecThreads) qkv_rope_vec_kernel(QkvRopeArgs a) {
  __shared__ float s_cos[kVecMaxHd / 2], s_sin[kVecMaxHd / 2];
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  const int hd = a.hd;
  const int half = hd / 2;
  const int lanes = hd / 16;  // L: power of two <= 32, so a head's lanes share a warp
  const int heads = a.hq + 2 * a.hk;
  const int items = heads * lanes;
  const int item = blockIdx.y * kVecThreads + threadIdx.x;
  const int h = item / lanes;  // >= heads past the last item (whole heads: items is a multiple of lanes)
  const int j = item - h * lanes;
  pdl_launch_dependents();
  // Before pdl_wait only host-written inputs (slots, positions, inv_freq).
  const int32_t slot = a.slot_mapping[t];
  const bool is_q = h < a.hq;
  const bool is_k = !is_q && h < a.hq + a.hk;
  // Inactive: past the last head, or K/V of a skipped slot (nothing to write).
  const bool active = item < items && (is_q || (slot >= 0 && slot < a.num_slots));
  const float pos = static_cast<float>(a.positions[t]);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = pos * a.inv_freq[i];
    s_cos[i] = cosf(angle) * a.attention_scaling;
    s_sin[i] = sinf(angle) * a.attention_scaling;
  }
  pdl_wait();
  float v1[8], v2[8];  // dims 8j + e and half + 8j + e
  if (active) {
    const T* src = static_cast<const T*>(a.qkv) + (t * heads + h) * static_cast<int64_t>(hd);
    load8_act<T>(src + 8 * j, v1);
    load8_act<T>(src + half + 8 * j, v2);
  }
  if (a.rms_x || a.rms_inv) {
    // The row scale (its loads overlap those above): every thread of the
    // block, active or not, since block_sum synchronises.
    const float row_inv = a.rms_inv
                              ? a.rms_inv[t]
                              : block_row_inv_rms(static_cast<const T*>(a.rms_x) + t * a.rms_d, a.rms_d, a.rms_eps, red);
    if (active) {
      // Plus the bias, rounded to T, as the projection of the normed rows stores it.
      const float* b = a.qkv_bias ? a.qkv_bias + static_cast<int64_t>(h) * hd : nullptr;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        v1[e] = b ? rms_scale_round<T>(v1[e], row_inv, b[8 * j + e]) : rms_scale_round<T>(v1[e], row_inv);
        v2[e] = b ? rms_scale_round<T>(v2[e], row_inv, b[half + 8 * j + e]) : rms_scale_round<T>(v2[e], row_inv);
      }
    }
  }
  __syncthreads();
  if (!active) return;
  if (is_q || is_k) {
    const float* nw = is_q ? a.q_norm : a.k_norm;
    if (nw) {
      float ss = 0.0f;
#pragma unroll
      for (int e = 0; e < 8; ++e) ss += v1[e] * v1[e] + v2[e] * v2[e];
      // The head's lanes are aligned groups of `lanes` consecutive lanes of one warp.
      const unsigned group = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u) << ((threadIdx.x & 31) & ~(lanes - 1));
      for (int o = lanes / 2; o > 0; o >>= 1) ss += __shfl_xor_sync(group, ss, o);
      const float inv = 1.0f / sqrtf(ss / static_cast<float>(hd) + a.eps);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        // Rounded to T, as head_rms_norm stores it before RoPE reads it.
        v1[e] = to_float(from_float<T>(v1[e] * inv * nw[8 * j + e]));
        v2[e] = to_float(from_float<T>(v2[e] * inv * nw[half + 8 * j + e]));
      }
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float cs = s_cos[8 * j + e], sn = s_sin[8 * j + e];
      const float x1 = v1[e], x2 = v2[e];
      // Each product rounded separately, as in torch (matches rope_kernel).
      v1[e] = __fmul_rn(x1, cs) - __fmul_rn(x2, sn);
      v2[e] = __fmul_rn(x2, cs) + __fmul_rn(x1, sn);
    }
  }
  if (is_q) {
    T* dst = static_cast<T*>(a.q_out) + (t * a.hq + h) * static_cast<int64_t>(hd);
    store8_act(dst + 8 * j, v1);
    store8_act(dst + half + 8 * j, v2);
    return;
  }
  // Rounded to the activation dtype first, as if k/v had been stored and kv_write had read them.
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    v1[e] = to_float(from_float<T>(v1[e]));
    v2[e] = to_float(from_float<T>(v2[e]));
  }
  const int kvh = is_k ? h - a.hq : h - a.hq - a.hk;
  const int64_t kv_row = static_cast<int64_t>(slot) * a.hk + kvh;
  KvT* dst = static_cast<KvT*>(is_k ? a.k_cache : a.v_cache) + kv_row * hd;
  if constexpr (kIsKvI8<KvT>) {
    // The row's scale from the max over the head's `lanes` lanes (an aligned group of one warp).
    float amax = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fmaxf(i8_amax_term(v1[e]), i8_amax_term(v2[e])));
    const unsigned group = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u) << ((threadIdx.x & 31) & ~(lanes - 1));
    for (int o = lanes / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(group, amax, o));
    const float s = i8_row_scale(amax);
    *reinterpret_cast<uint2*>(dst + 8 * j) = i8_quantize8(v1, s);
    *reinterpret_cast<uint2*>(dst + half + 8 * j) = i8_quantize8(v2, s);
    if (j == 0) (is_k ? a.k_row_scales : a.v_row_scales)[ops::kv_row_scale_index(slot, kvh, a.hk, a.block_size)] = s;
  } else {
    const float inv = is_k ? a.k_inv_scale : a.v_inv_scale;
    store8_kv(dst + 8 * j, v1, inv);
    store8_kv(dst + half + 8 * j, v2, inv);
  }
}

}  // namespace

void launch_qkv_rope_kv_write(const QkvRopeArgs& a, cudaStream_t stream) {
  if (a.n == 0) return;
  OSP_CHECK(a.hd > 0 && a.hd <= kMaxHd);
  OSP_CHECK(a.rotary_dim > 0 && a.rotary_dim % 2 == 0 && a.rotary_dim <= a.hd);
  OSP_CHECK_LE(a.n, int64_t{2147483647});
  const int heads = a.hq + 2 * a.hk;
  const int lanes = a.hd / 16;
  if (a.rotary_dim == a.hd && a.hd % 16 == 0 && a.hd <= kVecMaxHd && (lanes & (lanes - 1)) == 0 && aligned16(a.qkv) &&
      aligned16(a.q_out) && aligned16(a.k_cache) && aligned16(a.v_cache)) {
    const int chunks = (heads * lanes + kVecThreads - 1) / kVecThreads;
    const dim3 grid(static_cast<unsigned>(a.n), static_cast<unsigned>(chunks));
    OSP_DISPATCH_ACT(a.act, T, {
      OSP_DISPATCH_KV8(a.cache_dtype, KvT, {
        launch_pdl_if(attention_pdl_enabled(), qkv_rope_vec_kernel<T, KvT>, grid, dim3(kVecThreads), 0, stream, a);
      });
    });
    return;
  }
  const int threads = 32 * std::min(kWarps, heads);
  const dim3 grid(static_cast<unsigned>(a.n), static_cast<unsigned>((heads + kWarps - 1) / kWarps));
  OSP_DISPATCH_ACT(a.act, T, {
    OSP_DISPATCH_KV8(a.cache_dtype, KvT, {
      launch_pdl_if(attention_pdl_enabled(), qkv_rope_kernel<T, KvT>, grid, dim3(static_cast<unsigned>(threads)), 0,
                    stream, a);
    });
  });
}

}  // namespace osprey::cuda
