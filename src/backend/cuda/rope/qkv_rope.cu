// The fused attention input of one layer: reads the fused QKV projection,
// applies the optional per-head RMSNorm (Qwen3 q/k norm) and RoPE to q and k
// in registers, writes the rotated q and puts K/V straight into the pages.
// Replaces head_rms_norm + rope + kv_write (three passes over q/k/v).
//
// Layout: blocks (token, group of 8 heads), one warp per head (q heads,
// then k heads, then v heads), so a decode step still spreads over SMs. Lane j owns dims j + 32 * c of the
// head, c < kChunks, so the rotation partners i and i + rotary_dim / 2 are
// owned by lanes of the same warp and exchanged through shared memory.
#include <algorithm>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace osprey::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxHd = kMaxHeadDim;
constexpr int kChunks = kMaxHd / 32;

template <class T, class KvT>
__global__ void __launch_bounds__(kWarps * 32) qkv_rope_kernel(QkvRopeArgs a) {
  __shared__ float buf[kWarps][kMaxHd];
  const int64_t t = blockIdx.x;
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
      KvT* dst = cache + (static_cast<int64_t>(slot) * a.hk + kvh) * hd;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int d = lane + 32 * c;
        // Rounded to the activation dtype first, as if k/v had been stored and kv_write had read them.
        if (d < hd) dst[d] = from_float<KvT>(to_float(from_float<T>(v[c])));
      }
    }
  }
}

}  // namespace

void launch_qkv_rope_kv_write(const QkvRopeArgs& a, cudaStream_t stream) {
  if (a.n == 0) return;
  OSP_CHECK(a.hd > 0 && a.hd <= kMaxHd);
  OSP_CHECK(a.rotary_dim > 0 && a.rotary_dim % 2 == 0 && a.rotary_dim <= a.hd);
  OSP_CHECK_LE(a.n, int64_t{2147483647});
  const int heads = a.hq + 2 * a.hk;
  const int threads = 32 * std::min(kWarps, heads);
  const dim3 grid(static_cast<unsigned>(a.n), static_cast<unsigned>((heads + kWarps - 1) / kWarps));
  OSP_DISPATCH_ACT(a.act, T, {
    OSP_DISPATCH_FLOAT(a.cache_dtype, KvT, {
      qkv_rope_kernel<T, KvT><<<grid, threads, 0, stream>>>(a);
    });
  });
  OSP_CUDA_CHECK_LAUNCH();
}

}  // namespace osprey::cuda
