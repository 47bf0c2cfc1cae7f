// Paged attention for decode steps (one query token per sequence), split
// along the sequence (FlashDecoding) and GQA-aware: a block owns one
// (sequence, KV head, split) and all G = hq / hk query heads of that KV
// head, so each K/V row is read from memory once per step.
//
// Layout: 128 threads; a "lane group" of kLanes = hd / 8 threads holds one
// key's row (8 dims = 16 bytes of a 16-bit page per thread), so a warp
// covers 32 / kLanes keys at once and the block 4 * 32 / kLanes. Each lane
// group walks its keys kUnroll at a time (all K and V loads issued before
// use), keeping its own online-softmax state (m, l, acc) for the G heads;
// the groups' states are merged through shared memory at the end. With
// num_splits > 1 the block writes unnormalised partials for
// combine_splits (paged_attention.cu's format).
//
// Graph contract: the grid depends on num_seqs, hk and num_splits only; a
// sequence's range [lo, hi) and its split's share are computed here from
// kv_lens and positions in device memory.
#include <algorithm>
#include <climits>
#include <type_traits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/kernels.h"

namespace osprey::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kUnroll = 4;

// Eight consecutive page values as fp32 (16-bit pages: one 16-byte load;
// fp32 pages: two).
template <class KvT>
__device__ __forceinline__ void load8_kv(const KvT* p, float out[8]) {
  if constexpr (std::is_same_v<KvT, float>) {
    load8_act<float>(p, out);
  } else {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if constexpr (std::is_same_v<KvT, __half>) {
        out[2 * j] = __half2float(__ushort_as_half(static_cast<uint16_t>(w[j] & 0xffffu)));
        out[2 * j + 1] = __half2float(__ushort_as_half(static_cast<uint16_t>(w[j] >> 16)));
      } else {
        out[2 * j] = __uint_as_float(w[j] << 16);
        out[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
      }
    }
  }
}

template <int kHd, int kG, class KvT, class QT>
__global__ void __launch_bounds__(kThreads) decode_attention_kernel(PagedAttentionArgs a) {
  constexpr int kLanes = kHd / 8;                // threads per key row
  constexpr int kGroups = kThreads / kLanes;     // lane groups in the block
  extern __shared__ float smem[];
  float* sQ = smem;                              // [kG][kHd]
  float* sAcc = sQ + kG * kHd;                   // [kGroups][kG][kHd]
  float* sM = sAcc + kGroups * kG * kHd;         // [kGroups][kG]
  float* sL = sM + kGroups * kG;                 // [kGroups][kG]

  const int seq = blockIdx.x;
  const int kvh = blockIdx.y;
  const int split = blockIdx.z;
  const int tid = threadIdx.x;
  const int grp = tid / kLanes;
  const int sub = tid % kLanes;                  // dims [8 sub, 8 sub + 8)
  const int token = a.q_indptr[seq];
  const int kv_len = a.kv_lens[seq];
  const int pos = a.positions[token];
  int hi = min(pos + 1, kv_len);
  int lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
  if (hi < lo) hi = lo;
  const int span = hi - lo;
  const int per_split = (span + a.num_splits - 1) / a.num_splits;
  const int chunk = max((per_split + 31) / 32 * 32, a.min_keys_per_split);
  const int my_lo = min(hi, lo + split * chunk);
  const int my_hi = min(hi, my_lo + chunk);

  const QT* q = static_cast<const QT*>(a.q) + (static_cast<int64_t>(token) * a.hq + kvh * kG) * kHd;
  for (int i = tid; i < kG * kHd; i += kThreads) sQ[i] = to_float(q[i]) * a.scale;
  __syncthreads();
  float qv[kG][8];
#pragma unroll
  for (int g = 0; g < kG; ++g)
#pragma unroll
    for (int e = 0; e < 8; ++e) qv[g][e] = sQ[g * kHd + 8 * sub + e];

  float m[kG], l[kG], acc[kG][8];
#pragma unroll
  for (int g = 0; g < kG; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[g][e] = 0.0f;
  }

  const int32_t* pages = a.block_indices + a.block_indptr[seq];
  const KvT* kc = static_cast<const KvT*>(a.k_cache);
  const KvT* vc = static_cast<const KvT*>(a.v_cache);
  const int bs = a.block_size;
  const int64_t row_off = static_cast<int64_t>(kvh) * kHd + 8 * sub;
  const int64_t slot_stride = static_cast<int64_t>(a.hk) * kHd;

  // Same trip count for every thread (the shuffles below span the warp).
  for (int base = my_lo; base < my_hi; base += kGroups * kUnroll) {
    float kv[kUnroll][8], vv[kUnroll][8];
    bool valid[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int p = base + grp + u * kGroups;
      valid[u] = p < my_hi;
      if (valid[u]) {
        const int64_t slot = static_cast<int64_t>(pages[p / bs]) * bs + p % bs;
        load8_kv<KvT>(kc + slot * slot_stride + row_off, kv[u]);
        load8_kv<KvT>(vc + slot * slot_stride + row_off, vv[u]);
      }
    }
    float s[kUnroll][kG];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int g = 0; g < kG; ++g) {
        float d = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; ++e) d += qv[g][e] * kv[u][e];
#pragma unroll
        for (int o = kLanes / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        s[u][g] = valid[u] ? d : -INFINITY;
      }
#pragma unroll
    for (int g = 0; g < kG; ++g) {
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) mx = fmaxf(mx, s[u][g]);
      if (mx == -INFINITY) continue;  // nothing valid yet for this group
      const float alpha = expf(m[g] - mx);
      l[g] *= alpha;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[g][e] *= alpha;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const float p = expf(s[u][g] - mx);  // 0 for invalid keys
        l[g] += p;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[g][e] += p * (valid[u] ? vv[u][e] : 0.0f);
      }
      m[g] = mx;
    }
  }

  // Merge the lane groups: states to shared memory, then one thread per (head, dim).
#pragma unroll
  for (int g = 0; g < kG; ++g) {
#pragma unroll
    for (int e = 0; e < 8; ++e) sAcc[(grp * kG + g) * kHd + 8 * sub + e] = acc[g][e];
    if (sub == 0) {
      sM[grp * kG + g] = m[g];
      sL[grp * kG + g] = l[g];
    }
  }
  __syncthreads();
  for (int i = tid; i < kG * kHd; i += kThreads) {
    const int g = i / kHd;
    const int d = i - g * kHd;
    float mx = -INFINITY;
    for (int r = 0; r < kGroups; ++r) mx = fmaxf(mx, sM[r * kG + g]);
    float lsum = 0.0f, asum = 0.0f;
    if (mx != -INFINITY) {
      for (int r = 0; r < kGroups; ++r) {
        const float w = expf(sM[r * kG + g] - mx);  // 0 for empty groups
        lsum += w * sL[r * kG + g];
        asum += w * sAcc[(r * kG + g) * kHd + d];
      }
    }
    const int head = kvh * kG + g;
    if (a.num_splits == 1) {
      QT* o = static_cast<QT*>(a.out) + (static_cast<int64_t>(token) * a.hq + head) * kHd;
      o[d] = from_float<QT>(lsum > 0.0f ? asum / lsum : 0.0f);
    } else {
      const int64_t idx = (static_cast<int64_t>(split) * a.num_tokens + token) * a.hq + head;
      a.part_acc[idx * kHd + d] = asum;
      if (d == 0) {
        a.part_ml[idx * 2] = mx;
        a.part_ml[idx * 2 + 1] = lsum;
      }
    }
  }
}

template <int kHd, int kG, class KvT, class QT>
void launch_typed(const PagedAttentionArgs& a, cudaStream_t stream) {
  constexpr int kGroups = kThreads / (kHd / 8);
  constexpr size_t smem = sizeof(float) * (kG * kHd + kGroups * kG * kHd + 2 * kGroups * kG);
  static_assert(smem <= 48 * 1024, "decode attention shared memory");
  const dim3 grid(static_cast<unsigned>(a.num_seqs), static_cast<unsigned>(a.hk), static_cast<unsigned>(a.num_splits));
  decode_attention_kernel<kHd, kG, KvT, QT><<<grid, kThreads, smem, stream>>>(a);
  OSP_CUDA_CHECK_LAUNCH();
}

template <int kHd, class KvT, class QT>
bool launch_for_group(const PagedAttentionArgs& a, cudaStream_t stream) {
  switch (a.hq / a.hk) {
    case 1:
      launch_typed<kHd, 1, KvT, QT>(a, stream);
      return true;
    case 2:
      launch_typed<kHd, 2, KvT, QT>(a, stream);
      return true;
    case 4:
      launch_typed<kHd, 4, KvT, QT>(a, stream);
      return true;
    case 8:
      launch_typed<kHd, 8, KvT, QT>(a, stream);
      return true;
    default:
      return false;
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace

bool decode_attention_supported(const PagedAttentionArgs& a) {
  const int g = a.hk > 0 ? a.hq / a.hk : 0;
  return (a.hd == 64 || a.hd == 128) && (g == 1 || g == 2 || g == 4 || g == 8) && a.hq == g * a.hk &&
         aligned16(a.k_cache) && aligned16(a.v_cache) && (a.act == DType::kF32 || a.act == DType::kBF16) &&
         (a.kv_dtype == DType::kF32 || a.kv_dtype == DType::kF16 || a.kv_dtype == DType::kBF16);
}

void launch_decode_attention(const PagedAttentionArgs& a, cudaStream_t stream) {
  OSP_CHECK(decode_attention_supported(a));
  OSP_CHECK(a.num_tokens == a.num_seqs);
  OSP_CHECK(a.num_splits == 1 || (a.part_acc != nullptr && a.part_ml != nullptr));
  if (a.num_seqs == 0) return;
  OSP_DISPATCH_ACT(a.act, QT, OSP_DISPATCH_FLOAT(a.kv_dtype, KvT, {
                     if (a.hd == 64) {
                       launch_for_group<64, KvT, QT>(a, stream);
                     } else {
                       launch_for_group<128, KvT, QT>(a, stream);
                     }
                   }));
  if (a.num_splits > 1) launch_combine_splits(a, stream);
}

}  // namespace osprey::cuda
