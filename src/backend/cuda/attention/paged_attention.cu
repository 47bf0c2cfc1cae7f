// Paged attention for prefill and decode in one kernel family.
//
// Work tile: kAttnTileRows rows of one sequence and one KV head, where row r
// of the sequence is (query token r / G, query head kv_head * G + r % G) and
// G = hq / hk; so the query heads sharing a KV head read each K/V tile once.
// A block walks the tile's KV range in tiles of kKeys keys (gathered from the
// pages into shared memory, converted to fp32; F8_E4M3 pages times their
// scale: attention/kv_fp8.cuh) with an online softmax in
// fp32. For long contexts with few tiles the KV range is split over
// gridDim.z blocks whose partial results (unnormalised acc, running max m,
// sum l) a second kernel merges.
//
// Thread layout: 128 threads = 16 rows x 8 lanes; lane `sub` of a row owns
// score columns sub + 8 * j and output dims sub + 8 * j, so the row's softmax
// state lives in the 8 lanes of that row (same warp).
#include <algorithm>
#include <climits>

#include "backend/cuda/attention/kv_fp8.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/device_query.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"

namespace osprey::cuda {
namespace {

constexpr int kRows = kAttnTileRows;
constexpr int kKeys = 32;
constexpr int kSub = 8;
constexpr int kThreads = kRows * kSub;
static_assert(kThreads == 128 && kSub <= 32 && 32 % kSub == 0, "rows must not straddle warps");

template <int kHd>
constexpr size_t smem_bytes() {
  constexpr int pad = kHd + 1;  // rows of sQ/sK one bank apart
  return sizeof(float) * (kRows * pad + 2 * kKeys * pad + kRows * (kKeys + 1)) + sizeof(int) * (kKeys + 2 * kRows);
}

__device__ __forceinline__ float group_max(float v) {
#pragma unroll
  for (int o = kSub / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = kSub / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <int kHd, class KvT, class QT>
__global__ void __launch_bounds__(kThreads) paged_attention_kernel(PagedAttentionArgs a, int tiles_per_seq) {
  constexpr int kPad = kHd + 1;
  constexpr int kPerLane = kHd / kSub;
  extern __shared__ float smem[];
  float* sQ = smem;                                               // [kRows][kPad]
  float* sK = sQ + kRows * kPad;                                  // [kKeys][kPad]
  float* sV = sK + kKeys * kPad;                                  // [kKeys][kPad]
  float* sP = sV + kKeys * kPad;                                  // [kRows][kKeys + 1]
  int* sSlot = reinterpret_cast<int*>(sP + kRows * (kKeys + 1));  // [kKeys]
  int* sLo = sSlot + kKeys;                                       // [kRows]
  int* sHi = sLo + kRows;                                         // [kRows]

  const int seq = blockIdx.x / tiles_per_seq;
  const int tile = blockIdx.x % tiles_per_seq;
  const int kvh = blockIdx.y;
  const int split = blockIdx.z;
  const int group = a.hq / a.hk;
  const int q_begin = a.q_indptr[seq];
  const int total_rows = (a.q_indptr[seq + 1] - q_begin) * group;
  const int row0 = tile * kRows;
  if (row0 >= total_rows) return;  // uniform over the block
  const int kv_len = a.kv_lens[seq];
  const int hd = a.hd;

  const int tid = threadIdx.x;
  const int row = tid / kSub;
  const int sub = tid % kSub;
  const int grow = row0 + row;
  const bool row_valid = grow < total_rows;
  int token = 0, head = 0, lo = INT_MAX, hi = INT_MIN;  // this row's keys: [lo, hi)
  if (row_valid) {
    token = q_begin + grow / group;
    head = kvh * group + grow % group;
    const int pos = a.positions[token];
    hi = min(pos + 1, kv_len);
    lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
    if (hi <= lo) {
      lo = INT_MAX;
      hi = INT_MIN;
    }
  }
  const QT* qrow = static_cast<const QT*>(a.q) + (static_cast<int64_t>(token) * a.hq + head) * hd;
  for (int d = sub; d < kHd; d += kSub) sQ[row * kPad + d] = row_valid && d < hd ? to_float(qrow[d]) : 0.0f;
  if (sub == 0) {
    sLo[row] = lo;
    sHi[row] = hi;
  }
  __syncthreads();
  int tile_lo = INT_MAX, tile_hi = INT_MIN;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    tile_lo = min(tile_lo, sLo[r]);
    tile_hi = max(tile_hi, sHi[r]);
  }
  int my_lo = 0, my_hi = 0;  // this split's keys
  if (tile_lo < tile_hi) {
    const int span = tile_hi - tile_lo;
    const int per_split = (span + a.num_splits - 1) / a.num_splits;
    const int chunk = max((per_split + kKeys - 1) / kKeys * kKeys, a.min_keys_per_split);
    my_lo = min(tile_hi, tile_lo + split * chunk);  // splits past the range are empty
    my_hi = min(tile_hi, my_lo + chunk);
  }

  float m = -INFINITY, l = 0.0f;
  float acc[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) acc[j] = 0.0f;

  const int32_t* pages = a.block_indices + a.block_indptr[seq];
  const KvT* kc = static_cast<const KvT*>(a.k_cache);
  const KvT* vc = static_cast<const KvT*>(a.v_cache);
  const int64_t slot_stride = static_cast<int64_t>(a.hk) * hd;
  const int bs = a.block_size;

  for (int kb = my_lo; kb < my_hi; kb += kKeys) {
    __syncthreads();  // the previous tile's sK / sV / sSlot are no longer read
    if (tid < kKeys) {
      const int kp = kb + tid;
      sSlot[tid] = kp < my_hi ? pages[kp / bs] * bs + kp % bs : -1;
    }
    __syncthreads();
    for (int idx = tid; idx < kKeys * hd; idx += kThreads) {
      const int j = idx / hd;
      const int d = idx - j * hd;
      const int slot = sSlot[j];
      float kv = 0.0f, vv = 0.0f;
      if (slot >= 0) {
        const int64_t off = static_cast<int64_t>(slot) * slot_stride + static_cast<int64_t>(kvh) * hd + d;
        kv = kv_to_float(kc[off], a.k_scale);
        vv = kv_to_float(vc[off], a.v_scale);
      }
      sK[j * kPad + d] = kv;
      sV[j * kPad + d] = vv;
    }
    __syncthreads();

    float sc[kKeys / kSub];
    float tmax = -INFINITY;
#pragma unroll
    for (int jj = 0; jj < kKeys / kSub; ++jj) {
      const int j = sub + kSub * jj;
      const int kp = kb + j;
      const float* qr = sQ + row * kPad;
      const float* kr = sK + j * kPad;
      float dot = 0.0f;
      for (int d = 0; d < hd; ++d) dot += qr[d] * kr[d];
      const bool valid = kp >= lo && kp < hi && kp < my_hi;
      sc[jj] = valid ? dot * a.scale : -INFINITY;
      tmax = fmaxf(tmax, sc[jj]);
    }
    tmax = group_max(tmax);
    const float m_new = fmaxf(m, tmax);
    float psum = 0.0f;
    float alpha = 1.0f;
    if (m_new != -INFINITY) {
      alpha = expf(m - m_new);  // 0 while m is still -inf
#pragma unroll
      for (int jj = 0; jj < kKeys / kSub; ++jj) {
        const float p = expf(sc[jj] - m_new);  // 0 for masked keys
        sP[row * (kKeys + 1) + sub + kSub * jj] = p;
        psum += p;
      }
    } else {
#pragma unroll
      for (int jj = 0; jj < kKeys / kSub; ++jj) sP[row * (kKeys + 1) + sub + kSub * jj] = 0.0f;
    }
    psum = group_sum(psum);
    l = l * alpha + psum;
    m = m_new;
    __syncwarp();  // sP of this row is written and read by the same warp
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) acc[j] *= alpha;
    for (int c = 0; c < kKeys; ++c) {
      const float p = sP[row * (kKeys + 1) + c];
      const float* vr = sV + c * kPad + sub;
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) acc[j] += p * vr[kSub * j];
    }
  }

  if (!row_valid) return;
  if (a.num_splits == 1) {
    QT* o = static_cast<QT*>(a.out) + (static_cast<int64_t>(token) * a.hq + head) * hd;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int d = sub + kSub * j;
      if (d < hd) o[d] = from_float<QT>(l > 0.0f ? acc[j] / l : 0.0f);
    }
  } else {
    const int64_t idx = (static_cast<int64_t>(split) * a.num_tokens + token) * a.hq + head;
    float* o = a.part_acc + idx * hd;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int d = sub + kSub * j;
      if (d < hd) o[d] = acc[j];
    }
    if (sub == 0) {
      a.part_ml[idx * 2] = m;
      a.part_ml[idx * 2 + 1] = l;
    }
  }
}

// One block per (token, query head): merges the splits' partial results.
// Warp 0 turns the splits' (m, l) into weights w_z = exp(m_z - M) / sum
// (num_splits <= kMaxCombineSplits), then every thread sums its dims over
// the splits with independent loads.
constexpr int kMaxCombineSplits = 64;

template <class QT>
__global__ void combine_splits_kernel(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                      int num_splits, int64_t rows, int hd, QT* __restrict__ out) {
  __shared__ float sw[kMaxCombineSplits];
  // Lets the next PDL kernel (the o-projection GEMV) become resident and
  // stream its weights while this small grid runs; it still waits for this
  // grid's completion before reading the output (pdl.cuh).
  pdl_launch_dependents();
  const int64_t r = blockIdx.x;  // token * hq + head
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float w[2];
    split_merge_weights<false>(part_ml, rows, r, num_splits, lane, w);
#pragma unroll
    for (int i = 0; i < 2; ++i) sw[lane + 32 * i] = w[i];  // kMaxCombineSplits = 64 entries
  }
  __syncthreads();
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float num = 0.0f;
#pragma unroll 4
    for (int z = 0; z < num_splits; ++z) {
      const float wz = sw[z];
      if (wz != 0.0f) num += wz * part_acc[(z * rows + r) * hd + d];
    }
    out[r * hd + d] = from_float<QT>(num);
  }
}

template <int kHd, class KvT, class QT>
void launch_typed(const PagedAttentionArgs& a, cudaStream_t stream) {
  const int group = a.hq / a.hk;
  const int tiles = attention_tiles_per_seq(a.max_q_len, group);
  const int64_t blocks_x = static_cast<int64_t>(a.num_seqs) * tiles;
  OSP_CHECK_LE(blocks_x, int64_t{2147483647});
  constexpr size_t smem = smem_bytes<kHd>();
  auto kernel = paged_attention_kernel<kHd, KvT, QT>;
  if (smem > 48 * 1024) set_max_dynamic_smem_once(kernel, smem);
  const dim3 grid(static_cast<unsigned>(blocks_x), static_cast<unsigned>(a.hk), static_cast<unsigned>(a.num_splits));
  kernel<<<grid, kThreads, smem, stream>>>(a, tiles);
  OSP_CUDA_CHECK_LAUNCH();
  if (a.num_splits > 1) launch_combine_splits(a, stream);
}

template <class KvT, class QT>
void launch_for_kv(const PagedAttentionArgs& a, cudaStream_t stream) {
  if (a.hd <= 64) {
    launch_typed<64, KvT, QT>(a, stream);
  } else if (a.hd <= 128) {
    launch_typed<128, KvT, QT>(a, stream);
  } else {
    launch_typed<256, KvT, QT>(a, stream);
  }
}

}  // namespace

void launch_combine_splits(const PagedAttentionArgs& a, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(a.num_tokens) * a.hq;
  if (rows == 0) return;
  OSP_CHECK_LE(a.num_splits, kMaxCombineSplits);
  const int threads = std::clamp(a.hd / 32 * 32, 32, 128);
  OSP_DISPATCH_ACT(a.act, QT,
                   combine_splits_kernel<QT><<<static_cast<unsigned>(rows), threads, 0, stream>>>(
                       a.part_acc, a.part_ml, a.num_splits, rows, a.hd, static_cast<QT*>(a.out)));
  OSP_CUDA_CHECK_LAUNCH();
}

void launch_paged_attention(const PagedAttentionArgs& a, cudaStream_t stream) {
  if (a.num_tokens == 0 || a.num_seqs == 0 || a.max_q_len == 0) return;
  OSP_CHECK(a.hk > 0 && a.hq % a.hk == 0);
  OSP_CHECK(a.hd > 0 && a.hd <= kMaxHeadDim);
  OSP_CHECK(a.num_splits >= 1 && a.num_splits <= kMaxCombineSplits);
  OSP_CHECK_MSG(a.kv_dtype != DType::kI8, "I8 KV pages take the tensor-core decode and prefill kernels only");
  OSP_CHECK(a.num_splits == 1 || (a.part_acc != nullptr && a.part_ml != nullptr));
  OSP_DISPATCH_ACT(a.act, QT, OSP_DISPATCH_KV(a.kv_dtype, KvT, launch_for_kv<KvT, QT>(a, stream)));
}

}  // namespace osprey::cuda
