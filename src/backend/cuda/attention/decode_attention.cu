// Paged attention for decode steps (one query token per sequence), split
// along the sequence (FlashDecoding) and GQA-aware: a block owns one
// (sequence, KV head, split) and all G = hq / hk query heads of that KV
// head, so each K/V row is read from memory once per step (the tensor-core
// kernel takes up to 8 heads a block: G > 8 reads each row ceil(G / 8)
// times, HeadRows). With
// num_splits > 1 the block writes unnormalised partials for combine_splits
// (paged_attention.cu's format); otherwise the normalised output.
//
// Two kernels compute the same function:
//
// * The tensor-core kernel (16-bit q/out and pages of the same dtype, the
//   serving case, or F8_E4M3 or I8 pages: the comment at mma_decode_kernel;
//   any G, compiled once per head_dim and dtypes: G is read at run time). Four
//   warps per block; warp w takes the block's key tiles
//   w, w + 4, ... of kTileKeys = 16 keys (a whole page at block_size 16).
//   Each warp streams its tiles with 16-byte cp.async into its own
//   kStages-deep ring of shared-memory stages (K and V rows of 2 hd bytes,
//   16-byte chunks XOR-swizzled by row so ldmatrix is conflict-free), so
//   kStages - 1 tiles per warp are in flight while one is computed; the page
//   table entry of the tile after next is loaded one iteration early. Scores
//   S = Q K^T and the update O += P V are m16n8k16 mma.sync with the G query
//   heads as rows 0..G-1 of the 16-row operand (the others zero): per 16
//   keys 2 hd / 16 MMAs and hd / 8 ldmatrix.x4 per warp, so the instruction
//   count per byte is a small fraction of the SIMT kernel's and the kernel
//   is bound by the bytes in flight. The online softmax runs in the log2
//   domain (fp32 scores times scale * log2 e) on the MMA accumulator layout:
//   a score row lives in the 4 lanes of a quad, P is rounded to the 16-bit
//   type for the P V product (as in FlashAttention), l and O stay fp32. The
//   warps' states are merged through shared memory at the end.
// * The SIMT kernel (any supported act / page dtype pair, e.g. F32; F8
//   pages through load8_kv). 128 threads; a "lane group" of kLanes = hd / 8
//   threads holds one key's row (8 dims = 16 bytes of a 16-bit page per
//   thread), so a warp covers
//   32 / kLanes keys at once and the block 4 * 32 / kLanes. Each lane group
//   walks its keys kUnroll at a time (all K and V loads issued before use),
//   keeping its own online-softmax state (m, l, acc) for the G heads; the
//   groups' states are merged through shared memory at the end.
//
// OSPREY_DECODE_ATTENTION=simt in the environment (read once) makes the SIMT
// kernel run where the tensor-core one would: the A/B of gpu_op_bench.
//
// Splits past the context: the plan fixes num_splits (graph contract), but
// a split takes at least min_keys_per_split keys, so a short context uses
// only the first ceil(span / chunk) splits; the tensor-core kernel's blocks
// of the others write (m = -inf, l = 0) for their heads and exit (the merge
// gives them weight 0 and reads nothing else of theirs). The tensor-core
// kernel's minimum is kMmaMinKeysPerDecodeSplit; OSPREY_DECODE_MIN_KEYS
// overrides it (read once; the A/B switch of model_bench).
//
// Split merge in the kernel (tensor-core kernel, args.split_tickets set):
// every block writes its partials, then takes a ticket from its (sequence,
// KV head[, part of the heads: G > 8])'s counter (__threadfence,
// atomicAdd); the block that draws the
// last one resets the counter to 0 and merges the splits into out, with
// combine_splits' arithmetic (paged_attention.cu: the same weights, the
// splits summed in the same order, zero weights skipped). The counters start zeroed and every complete launch
// leaves them zero, so graph replays see what eager steps see. It replaces
// the combine kernel's launch and grid drain, which is most of a batch-1
// layer's attention time. OSPREY_DECODE_MERGE=kernel (read once) keeps the
// combine kernel: the A/B switch. The kernel is launched with programmatic
// dependent launch after qkv_rope_kv_write (its pre-wait part: the comment
// at the top of mma_decode_kernel) and triggers its own dependents at its
// start, so the o-projection GEMV's blocks become resident and load their
// first weight chunks while attention runs (H200, session 37: batch-1
// steps 1-4.5% faster; a trigger after the key loop measured in between,
// and on an H100 in session 12 0.02-0.03 ms slower than none: docs/cuda.md).
//
// A decode step has one query token per sequence (num_tokens == num_seqs and
// max_q_len <= 1, checked by the backend), so the tensor-core kernel takes
// token = seq instead of loading q_indptr: one global round trip fewer
// before the first K/V tile.
//
// Graph contract: the grid depends on num_seqs, hk and num_splits only
// (plan_decode_splits picks num_splits from num_seqs and the device); a
// sequence's range [lo, hi) and its split's share are computed here from
// kv_lens and positions in device memory.
#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "backend/cuda/attention/kv_fp8.cuh"
#include "backend/cuda/attention/mma_ptx.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/device_query.h"
#include "backend/cuda/host_util.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/pdl.cuh"
#include "ops/backend.h"

namespace osprey::cuda {
namespace {

// ---- SIMT kernel ---------------------------------------------------------------

constexpr int kThreads = 128;
constexpr int kUnroll = 4;

template <int kHd, int kG, class KvT, class QT>
__global__ void __launch_bounds__(kThreads) simt_decode_kernel(PagedAttentionArgs a) {
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
        load8_kv<KvT>(kc + slot * slot_stride + row_off, kv[u], a.k_scale);
        load8_kv<KvT>(vc + slot * slot_stride + row_off, vv[u], a.v_scale);
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
void launch_simt(const PagedAttentionArgs& a, cudaStream_t stream) {
  constexpr int kGroups = kThreads / (kHd / 8);
  constexpr size_t smem = sizeof(float) * (kG * kHd + kGroups * kG * kHd + 2 * kGroups * kG);
  static_assert(smem <= 48 * 1024, "decode attention shared memory");
  const dim3 grid(static_cast<unsigned>(a.num_seqs), static_cast<unsigned>(a.hk), static_cast<unsigned>(a.num_splits));
  simt_decode_kernel<kHd, kG, KvT, QT><<<grid, kThreads, smem, stream>>>(a);
  OSP_CUDA_CHECK_LAUNCH();
}

// ---- tensor-core kernel -----------------------------------------------------------

constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = 32 * kMmaWarps;
constexpr int kTileKeys = 16;  // keys per warp tile
constexpr int kStages = 3;     // shared-memory stages per warp (tiles in flight + 1)
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

// Shared memory: the warps' stage rings [kMmaWarps][kStages][K, V][kTileKeys
// rows of kHd page values (2 kHd bytes, kHd for F8 and I8)] (I8: each stage
// followed by its keys' K and V row scales, [2][kTileKeys] fp32), reused
// after the key loop for the merge (sO [kMmaWarps][kG][kHd], sM, sL
// [kMmaWarps][kG], fp32).
// I8 pages: the bytes of a stage's row scales (K and V of its kTileKeys keys).
template <class KvT>
constexpr int mma_scale_bytes() {
  return kIsKvI8<KvT> ? 2 * kTileKeys * static_cast<int>(sizeof(float)) : 0;
}

template <int kHd, int kG, int kValueBytes = 2, int kScaleBytes = 0>
constexpr size_t mma_smem_bytes() {
  constexpr size_t pipe = size_t{kMmaWarps} * kStages * (2 * kTileKeys * kHd * kValueBytes + kScaleBytes);
  constexpr size_t merge = sizeof(float) * kMmaWarps * kG * (kHd + 2);
  return pipe > merge ? pipe : merge;
}

// m16n8k16 with fp32 accumulators for a 16-bit type T whose A operand has
// rows 8..15 zero: a0 = A[g][2q, 2q + 1], a2 = A[g][2q + 8, 2q + 9] (g = lane
// / 4, q = lane % 4); b0, b1 the B fragment; c[0..1] = C[g][2q, 2q + 1]
// (c[2..3], rows g + 8, stay 0).
template <class T>
struct Mma16;
template <>
struct Mma16<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
  static __device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
  }
};
template <>
struct Mma16<__half> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
  static __device__ __forceinline__ void mma(float (&c)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(0u), "r"(a2), "r"(0u), "r"(b0), "r"(b1));
  }
};

// The query heads a block of the tensor-core kernel takes: up to
// kMmaMaxRows of one KV head's G, as rows 0..7 of its MMAs (rows 8..15 are
// zero). G > kMmaMaxRows takes ceil(G / kMmaMaxRows) blocks per KV head
// (grid y = hk * parts), each reading the head's K and V.
constexpr int kMmaMaxRows = 8;
__host__ __device__ constexpr int mma_head_parts(int group) { return (group + kMmaMaxRows - 1) / kMmaMaxRows; }
// The tensor-core kernel's grid y: hk KV heads x their parts (hk > 0).
int mma_grid_y(const PagedAttentionArgs& a) { return a.hk * mma_head_parts(a.hq / a.hk); }

struct HeadRows {
  int kvh;     // the KV head
  int head0;   // its first query head (MMA row 0)
  int rows;    // query heads taken, 1..kMmaMaxRows
  int ticket;  // the block's split-merge counter: seq * gridDim.y + its y
};

// The in-kernel split merge (file comment), called by every thread of a
// block once its partials for query heads hr.head0 .. + hr.rows - 1 of
// `token` are written (an empty split: only its (m, l)). Returns at once in
// all but the last block of (seq, hr) to finish; that one writes out[token,
// those heads, 0..kHd). used: the splits with keys (the others have weight
// 0). sw: dynamic shared memory for kMmaMaxRows * kMaxDecodeSplitsMerged
// floats and one int, free here (the kernel has no static shared memory: at hd 64 its
// dynamic 48 KB are the default limit, and any static byte more fails the
// launch).
constexpr int kMaxDecodeSplitsMerged = 64;  // two per lane of a warp
constexpr int kMergeBatch = 16;             // partial loads in flight per thread

template <int kHd, class T>
__device__ __forceinline__ void merge_splits_if_last(const PagedAttentionArgs& a, const HeadRows& hr, int token,
                                                     int used, float* sw) {
  volatile int* s_last = reinterpret_cast<volatile int*>(sw + kMmaMaxRows * kMaxDecodeSplitsMerged);
  __threadfence();  // this block's partials are visible device-wide before its ticket
  __syncthreads();  // (and every thread is done with the shared memory sw reuses)
  if (threadIdx.x == 0) {
    unsigned int* t = a.split_tickets + hr.ticket;
    const bool last = atomicAdd(t, 1u) == static_cast<unsigned int>(a.num_splits - 1);
    if (last) atomicExch(t, 0u);  // every block of this pair has taken its ticket
    *s_last = last ? 1 : 0;
  }
  __syncthreads();
  if (*s_last == 0) return;
  __threadfence();  // the other blocks' partials are read after their tickets
  const int ns = a.num_splits;
  const int64_t rows = static_cast<int64_t>(a.num_tokens) * a.hq;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  // Weights w_z = exp(m_z - M) / sum_z w_z l_z per head (combine_splits' warp 0 part).
  for (int h = warp; h < hr.rows; h += kMmaWarps) {
    const int64_t r = static_cast<int64_t>(token) * a.hq + hr.head0 + h;
    float w[2];
    split_merge_weights<true>(a.part_ml, rows, r, ns, lane, w);
#pragma unroll
    for (int i = 0; i < 2; ++i) sw[h * kMaxDecodeSplitsMerged + lane + 32 * i] = w[i];
  }
  __syncthreads();
  // out = sum_z w_z acc_z, 4 dims per thread (16-byte loads, kMergeBatch
  // splits in flight), splits in ascending order, skipping w_z == 0.
  for (int i = threadIdx.x; i < hr.rows * kHd / 4; i += kMmaThreads) {
    const int h = 4 * i / kHd;
    const int d = 4 * i - h * kHd;
    const int64_t r = static_cast<int64_t>(token) * a.hq + hr.head0 + h;
    const float* wz = sw + h * kMaxDecodeSplitsMerged;
    float num[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int z0 = 0; z0 < used; z0 += kMergeBatch) {
      float4 v[kMergeBatch];
#pragma unroll
      for (int j = 0; j < kMergeBatch; ++j) {
        v[j] = z0 + j < used ? __ldcg(reinterpret_cast<const float4*>(a.part_acc + ((z0 + j) * rows + r) * kHd + d))
                             : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
#pragma unroll
      for (int j = 0; j < kMergeBatch; ++j) {
        const float w = z0 + j < used ? wz[z0 + j] : 0.0f;
        if (w != 0.0f) {
          num[0] += w * v[j].x;
          num[1] += w * v[j].y;
          num[2] += w * v[j].z;
          num[3] += w * v[j].w;
        }
      }
    }
    T* o = static_cast<T*>(a.out) + r * kHd + d;
#pragma unroll
    for (int e = 0; e < 4; ++e) o[e] = from_float<T>(num[e]);
  }
}

// Byte offset of 16-byte chunk c of key row r in a stage tile (rows of
// kRowBytes; the chunk index XOR r % 8 spreads ldmatrix's 8 rows over the
// banks; 64-byte rows, two to a bank line, XOR (r / 2) % 4).
template <int kRowBytes>
__device__ __forceinline__ int tile_offset(int r, int c) {
  static_assert(kRowBytes >= 128 || kRowBytes == 64, "stage rows of 64 or >= 128 bytes");
  if constexpr (kRowBytes == 64) return r * kRowBytes + ((c ^ ((r >> 1) & 3)) << 4);
  return r * kRowBytes + ((c ^ (r & 7)) << 4);
}

// KvT = T (16-bit pages) or KvF8 (F8_E4M3 pages). F8 pages: the tiles are
// copied as they are (kHd bytes a row) and their fragments converted to
// half in registers (exact), so both products are f16 MMAs: q is rounded
// to half (exact for bf16 values of magnitude 2^-14 to 65504; beyond, it
// saturates at +-65504 rather than overflow to an infinity), P to half,
// the K scale goes on the fp32 scores and the V scale on the output. The
// fragments take the head dims in another order than the 16-bit pages',
// the same for both operands of a product (a dot product does not depend
// on it):
// * S = Q K^T, k step kk of 16 dims: ldmatrix of the 16-byte chunk of
//   dims [16 kk, 16 kk + 16) gives lane (g, q) bytes 4q..4q+3 of key g,
//   dims 16 kk + 4q + (0..3); MMA k index 2q + e is dim 16 kk + 4q + e and
//   2q + 8 + e is dim 16 kk + 4q + 2 + e (e < 2); q's fragment is loaded
//   to match.
// * O += P V: n tile t = 4 T + e holds, for column n, dim 4 (8 T + n) + e:
//   lane (g, q) reads the word of dims 4 (8 T + g) + (0..3) of keys 2q,
//   2q + 1, 2q + 8, 2q + 9 (32-bit shared loads) and interleaves each pair
//   of keys' bytes (prmt) into the e4m3 pairs of its B fragments.
// I8 pages (KvI8): the same byte layout and half MMAs as F8, with each
// key's row scales staged beside its tile (4-byte cp.async): the K scale
// goes on the key's fp32 score, and the V scale enters P V through the
// exponent: the warp keeps a second running max m' of s + log2(v scale)
// and computes P' = exp2(s + log2(v scale) - m') in [0, 1] for the P V
// product (l still sums exp2(s - m)); at the end O is brought to m's
// units by exp2(m' - m). So P' never leaves half's normal range because of
// a small or large scale.
template <int kHd, class T, class KvT>
__global__ void __launch_bounds__(kMmaThreads) mma_decode_kernel(PagedAttentionArgs a) {
  constexpr bool kF8 = kIsKvF8<KvT>;
  constexpr bool kI8 = kIsKvI8<KvT>;
  constexpr bool k8 = kF8 || kI8;  // one byte a value: the F8 byte layout, half MMAs
  using M = Mma16<std::conditional_t<k8, __half, T>>;
  constexpr int kRowBytes = kHd * static_cast<int>(sizeof(KvT));
  constexpr int kChunks = kRowBytes / 16;               // 16-byte chunks per key row
  constexpr int kTileBytes = kTileKeys * kRowBytes;     // one K or V tile
  constexpr int kScaleBytes = mma_scale_bytes<KvT>();  // a stage's row scales
  constexpr int kStageBytes = 2 * kTileBytes + kScaleBytes;
  constexpr int kRowsPerStep = 32 / kChunks;            // key rows one warp-wide copy step covers
  constexpr int kCopySteps = kTileKeys / kRowsPerStep;  // 16-byte copies per lane per K (or V) tile
  constexpr int kKSteps = kHd / 16;
  constexpr int kNTiles = kHd / 8;
  constexpr size_t kSmem = mma_smem_bytes<kHd, kMmaMaxRows, static_cast<int>(sizeof(KvT)), kScaleBytes>();
  static_assert(kSmem >= sizeof(float) * (kMmaMaxRows * kMaxDecodeSplitsMerged + 1),
                "the split merge's weights and flag fit the stage rings");
  extern __shared__ __align__(16) unsigned char mma_smem[];

  // With a.seq_order, the blocks in launch order (x fastest, then y, z:
  // roughly the order the SMs take them) walk the sequences longest first,
  // every (KV head, split) block of one sequence before the next: short
  // sequences' blocks fill the end of the grid instead of a long one's
  // starting late. A host-written array: read before pdl_wait (below).
  // Lets the next kernel (the o projection's GEMV, launched with PDL)
  // become resident at once and load its weights while this one runs
  // (without it, session 36's trace showed the GEMV starting only as this
  // grid exited). Its pdl_wait still waits for this whole grid.
  pdl_launch_dependents();
  int seq = blockIdx.x;
  int y = blockIdx.y;
  int split = blockIdx.z;
  if (a.seq_order != nullptr) {
    const int per_seq = static_cast<int>(gridDim.y * gridDim.z);
    const int linear = static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
    const int rest = linear % per_seq;
    seq = a.seq_order[linear / per_seq];
    y = rest % static_cast<int>(gridDim.y);
    split = rest / static_cast<int>(gridDim.y);
  }
  HeadRows hr;
  {
    const int group = a.hq / a.hk;
    const int parts = mma_head_parts(group);
    hr.kvh = y / parts;
    const int part = y - hr.kvh * parts;
    hr.head0 = hr.kvh * group + part * kMmaMaxRows;
    hr.rows = min(kMmaMaxRows, group - part * kMmaMaxRows);
    hr.ticket = seq * static_cast<int>(gridDim.y) + y;
  }
  const int kvh = hr.kvh;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int g = lane / 4;  // MMA row: query head hr.head0 + g (g < hr.rows)
  const int qd = lane % 4;
  const int token = seq;  // decode: q_indptr is the identity (file comment)
  // Programmatic dependent launch (launch_mma): up to pdl_wait below, only
  // host-written arrays (lengths, positions, page tables) and the K/V of
  // positions before the step's own token (written by earlier steps; this
  // step's qkv_rope_kv_write writes only position kv_len - 1 of each
  // sequence) are read, and nothing is written.
  const int kv_len = a.kv_lens[seq];
  const int pos = a.positions[token];
  int hi = min(pos + 1, kv_len);
  const int lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
  if (hi < lo) hi = lo;
  const int span = hi - lo;
  const int per_split = (span + a.num_splits - 1) / a.num_splits;
  const int chunk = max((per_split + kTileKeys - 1) / kTileKeys * kTileKeys, a.min_keys_per_split);
  const int my_lo = min(hi, lo + split * chunk);
  const int my_hi = min(hi, my_lo + chunk);
  if (a.num_splits > 1 && my_lo == my_hi) {
    pdl_wait();
    // A split past the context: the merge gives it weight 0 and reads only (m, l).
    if (threadIdx.x < hr.rows) {
      const int64_t idx = (static_cast<int64_t>(split) * a.num_tokens + token) * a.hq + hr.head0 + threadIdx.x;
      a.part_ml[idx * 2] = -INFINITY;
      a.part_ml[idx * 2 + 1] = 0.0f;
    }
    if (a.split_tickets != nullptr) {
      merge_splits_if_last<kHd, T>(a, hr, token, chunk > 0 ? (span + chunk - 1) / chunk : 0,
                                   reinterpret_cast<float*>(mma_smem));
    }
    return;
  }
  const int num_tiles = (my_hi - my_lo + kTileKeys - 1) / kTileKeys;
  const int my_tiles = num_tiles > warp ? (num_tiles - warp + kMmaWarps - 1) / kMmaWarps : 0;

  // Scores in the log2 domain (F8 pages: times the K scale).
  const float score_scale = (kF8 ? a.scale * a.k_scale : a.scale) * kLog2e;

  const int32_t* pages = a.block_indices + a.block_indptr[seq];
  const unsigned char* kc = static_cast<const unsigned char*>(a.k_cache);
  const unsigned char* vc = static_cast<const unsigned char*>(a.v_cache);
  const int64_t slot_bytes = static_cast<int64_t>(a.hk) * kRowBytes;
  const int64_t head_bytes = static_cast<int64_t>(kvh) * kRowBytes;
  const int bs = a.block_size;
  unsigned char* ring = mma_smem + static_cast<size_t>(warp) * kStages * kStageBytes;

  // Key row lane % 16 of this warp's tile i: its page-table entry (x) and
  // offset in the page (y), y = -1 past the range. The entry is loaded here
  // and first used by issue() an iteration later: nothing consumes the
  // load before then, so the warp does not wait for it (the slot's
  // multiply-add, computed here, stalled each tile on the load: ncu,
  // session 25).
  const bool bs_pow2 = (bs & (bs - 1)) == 0;
  const int bs_shift = __ffs(bs) - 1;
  auto lookup = [&](int i) -> int2 {
    const int key = my_lo + (warp + i * kMmaWarps) * kTileKeys + lane % kTileKeys;
    const bool valid = i < my_tiles && key < my_hi;
    const int page = bs_pow2 ? key >> bs_shift : key / bs;
    int entry = 0;
    if (valid) entry = pages[page];
    return make_int2(entry, valid ? key - page * bs : -1);
  };
  // Starts the copies of tile i's K and V rows into stage i % kStages; rows
  // past the range are zero-filled (P is 0 there, and 0 * garbage could be NaN).
  auto issue = [&](int i, int2 ref) {
    const int slot = ref.y >= 0 ? ref.x * bs + ref.y : -1;
    unsigned char* sk = ring + (i % kStages) * kStageBytes;
    unsigned char* sv = sk + kTileBytes;
    if constexpr (kI8) {  // lane l: the K (l < 16) or V row scale of key l % 16, whose slot it holds
      const float* rs = lane < kTileKeys ? a.k_row_scales : a.v_row_scales;
      const int64_t src = ref.y >= 0 ? ops::kv_row_scale_index_at<int64_t>(ref.x, ref.y, kvh, a.hk, bs) : 0;
      cp_async4(sv + kTileBytes + lane * sizeof(float), rs + src, slot >= 0 ? 4 : 0);
    }
    const int c = lane % kChunks;
#pragma unroll
    for (int j = 0; j < kCopySteps; ++j) {
      const int r = lane / kChunks + j * kRowsPerStep;
      const int s = __shfl_sync(0xffffffffu, slot, r);
      const int64_t src = s >= 0 ? s * slot_bytes + head_bytes + c * 16 : 0;
      const int bytes = s >= 0 ? 16 : 0;
      const int off = tile_offset<kRowBytes>(r, c);
      cp_async16(sk + off, kc + src, bytes);
      cp_async16(sv + off, vc + src, bytes);
    }
  };

  float m_run = -INFINITY;  // running max of row g (log2 domain), same in the quad
  float l_run = 0.0f;       // this lane's share of row g's sum
  [[maybe_unused]] float mv_run = -INFINITY;  // I8: running max of s + log2(v scale) (m', kernel comment)
  float o[kNTiles][4];
#pragma unroll
  for (int n = 0; n < kNTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;

  // The first stages' copies; those of tiles wholly before the step's own
  // token (key pos, or the window's end) start before pdl_wait.
  // pdl_wait is reached by every thread of the warp together (the tile
  // bounds are warp-uniform).
  bool waited = false;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    const int tile_end = my_lo + (warp + s * kMmaWarps + 1) * kTileKeys;  // one past the tile's last key
    if (!waited && (s >= my_tiles || tile_end > pos)) {
      pdl_wait();
      waited = true;
    }
    if (s < my_tiles) issue(s, lookup(s));
    cp_async_commit();
  }
  if (!waited) pdl_wait();

  // Q as the A operand (row g), as given (the scale goes on the fp32 scores).
  uint32_t qa[kKSteps][2];
  {
    const T* q = static_cast<const T*>(a.q) + (static_cast<int64_t>(token) * a.hq + hr.head0) * kHd;
#pragma unroll
    for (int kk = 0; kk < kKSteps; ++kk) {
      qa[kk][0] = 0u;
      qa[kk][1] = 0u;
      if (g < hr.rows) {
        if constexpr (k8) {  // dims 16 kk + 4 qd + (0, 1) and (2, 3) (kernel comment)
          const T* r = q + g * kHd + 16 * kk + 4 * qd;
          qa[kk][0] = f32x2_to_half2_bits_satfinite(to_float(r[0]), to_float(r[1]));
          qa[kk][1] = f32x2_to_half2_bits_satfinite(to_float(r[2]), to_float(r[3]));
        } else {
          const T* r = q + g * kHd + 16 * kk + 2 * qd;
          qa[kk][0] = M::pack(to_float(r[0]), to_float(r[1]));
          qa[kk][1] = M::pack(to_float(r[8]), to_float(r[9]));
        }
      }
    }
  }
  int2 slot_next = lookup(kStages - 1);
  for (int i = 0; i < my_tiles; ++i) {
    {
      const int t = i + kStages - 1;
      if (t < my_tiles) issue(t, slot_next);
      cp_async_commit();
      slot_next = lookup(t + 1);
    }
    cp_async_wait<kStages - 1>();  // tile i has landed
    __syncwarp();
    const unsigned char* sk = ring + (i % kStages) * kStageBytes;
    const unsigned char* sv = sk + kTileBytes;
    // One byte a value: codes of a 32-bit word w as the half2 bits of an
    // MMA operand register, bytes (0, 1) (lo) or (2, 3) (hi). I8: w is the
    // word after flip() (sign bits flipped once a word).
    [[maybe_unused]] auto flip = [](uint32_t w) {
      if constexpr (kI8) {
        return w ^ 0x80808080u;
      } else {
        return w;
      }
    };
    [[maybe_unused]] auto widen_lo = [](uint32_t w) {
      if constexpr (kI8) {
        return i8x2_flipped_to_half2_bits<0>(w);
      } else {
        return e4m3x2_to_half2_bits(w);
      }
    };
    [[maybe_unused]] auto widen_hi = [](uint32_t w) {
      if constexpr (kI8) {
        return i8x2_flipped_to_half2_bits<1>(w);
      } else {
        return e4m3x2_to_half2_bits(w >> 16);
      }
    };

    // S[g][key] for keys 2qd, 2qd + 1 (s[0]) and 8 + 2qd, 9 + 2qd (s[1]).
    float s[2][4] = {};
    if constexpr (k8) {
      // Matrix m of an ldmatrix.x4: keys 8 (m % 2) + (0..7), chunk 2 kk2 + m / 2.
#pragma unroll
      for (int kk2 = 0; kk2 < kKSteps / 2; ++kk2) {
        uint32_t b[4];
        const int mat = lane >> 3;
        ldmatrix_x4(b, sk + tile_offset<kRowBytes>((lane & 7) + ((mat & 1) << 3), 2 * kk2 + (mat >> 1)));
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int kk = 2 * kk2 + h;
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const uint32_t w = flip(b[2 * h + j]);
            M::mma(s[j], qa[kk][0], qa[kk][1], widen_lo(w), widen_hi(w));
          }
        }
      }
    } else {
#pragma unroll
      for (int kk = 0; kk < kKSteps; ++kk) {
        uint32_t b[4];
        const int r = (lane & 7) + ((lane >> 4) << 3);
        ldmatrix_x4(b, sk + tile_offset<kRowBytes>(r, 2 * kk + ((lane >> 3) & 1)));
        M::mma(s[0], qa[kk][0], qa[kk][1], b[0], b[1]);
        M::mma(s[1], qa[kk][0], qa[kk][1], b[2], b[3]);
      }
    }
    const int key0 = my_lo + (warp + i * kMmaWarps) * kTileKeys + 2 * qd;
    // I8: the row scales of keys 2 qd + 8 j + e: K's times the score, log2 of V's for P'.
    [[maybe_unused]] float ks[2][2], lv[2][2];
    if constexpr (kI8) {
      const float* sks = reinterpret_cast<const float*>(sv + kTileBytes);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const float2 k2 = *reinterpret_cast<const float2*>(sks + 2 * qd + 8 * j);
        const float2 v2 = *reinterpret_cast<const float2*>(sks + kTileKeys + 2 * qd + 8 * j);
        ks[j][0] = k2.x;
        ks[j][1] = k2.y;
        lv[j][0] = __log2f(v2.x);  // -inf for a zero row (P' = 0), NaN for a NaN row (it spreads, as on the CPU)
        lv[j][1] = __log2f(v2.y);
      }
    }
    float mt = -INFINITY;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float sc = s[j][e] * score_scale;
        if constexpr (kI8) sc *= ks[j][e];
        s[j][e] = key0 + 8 * j + e < my_hi ? sc : -INFINITY;
        mt = fmaxf(mt, s[j][e]);
      }
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
    // The tile's first key is in range, so m_new is finite.
    const float m_new = fmaxf(m_run, mt);
    const float alpha = fast_exp2(m_run - m_new);  // 0 on the first tile
    m_run = m_new;
    float p[2][2];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) p[j][e] = fast_exp2(s[j][e] - m_new);  // 0 past the range
    l_run = l_run * alpha + ((p[0][0] + p[0][1]) + (p[1][0] + p[1][1]));
    float alpha_o = alpha;  // O's rescale (I8: by m', below)
    if constexpr (kI8) {
      float mvt = -INFINITY;
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          lv[j][e] += s[j][e];  // s + log2(v scale): -inf past the range
          mvt = fmaxf(mvt, lv[j][e]);
        }
      mvt = fmaxf(mvt, __shfl_xor_sync(0xffffffffu, mvt, 1));
      mvt = fmaxf(mvt, __shfl_xor_sync(0xffffffffu, mvt, 2));
      const float mv_new = fmaxf(mv_run, mvt);
      // -inf while every key so far has a zero V row (O is still 0 then).
      alpha_o = mv_new == -INFINITY ? 1.0f : fast_exp2(mv_run - mv_new);
      mv_run = mv_new;
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) p[j][e] = mv_new == -INFINITY ? 0.0f : fast_exp2(lv[j][e] - mv_new);
    }
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      o[n][0] *= alpha_o;
      o[n][1] *= alpha_o;
    }
    // P as the A operand: keys 0..7 are s[0]'s columns, 8..15 s[1]'s.
    const uint32_t pa0 = M::pack(p[0][0], p[0][1]);
    const uint32_t pa2 = M::pack(p[1][0], p[1][1]);
    if constexpr (k8) {
#pragma unroll
      for (int tt = 0; tt < kHd / 32; ++tt) {
        // Keys 2 qd, 2 qd + 1, 2 qd + 8, 2 qd + 9: dims 4 (8 tt + g) + (0..3).
        const int c = 2 * tt + (g >> 2);
        const int byte = 4 * (g & 3);
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int r = 2 * qd + (i & 1) + 8 * (i >> 1);
          w[i] = flip(*reinterpret_cast<const uint32_t*>(sv + tile_offset<kRowBytes>(r, c) + byte));
        }
        // Per key pair: bytes (a0, b0, a1, b1) and (a2, b2, a3, b3).
        const uint32_t lo01 = __byte_perm(w[0], w[1], 0x5140), lo23 = __byte_perm(w[0], w[1], 0x7362);
        const uint32_t hi01 = __byte_perm(w[2], w[3], 0x5140), hi23 = __byte_perm(w[2], w[3], 0x7362);
        M::mma(o[4 * tt], pa0, pa2, widen_lo(lo01), widen_lo(hi01));
        M::mma(o[4 * tt + 1], pa0, pa2, widen_hi(lo01), widen_hi(hi01));
        M::mma(o[4 * tt + 2], pa0, pa2, widen_lo(lo23), widen_lo(hi23));
        M::mma(o[4 * tt + 3], pa0, pa2, widen_hi(lo23), widen_hi(hi23));
      }
    } else {
#pragma unroll
      for (int jj = 0; jj < kHd / 16; ++jj) {
        uint32_t b[4];
        const int r = (lane & 7) + (((lane >> 3) & 1) << 3);
        ldmatrix_x4_trans(b, sv + tile_offset<kRowBytes>(r, 2 * jj + (lane >> 4)));
        M::mma(o[2 * jj], pa0, pa2, b[0], b[1]);
        M::mma(o[2 * jj + 1], pa0, pa2, b[2], b[3]);
      }
    }
    __syncwarp();  // the stage is refilled by the next iteration's copies
  }
  cp_async_wait<0>();
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
  if constexpr (kI8) {  // O from m' units to m's (kernel comment); a warp without keys keeps O = 0
    const float f = m_run == -INFINITY || mv_run == -INFINITY ? 0.0f : exp2f(mv_run - m_run);
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      o[n][0] *= f;
      o[n][1] *= f;
    }
  }

  // Merge the warps (a warp without tiles has m = -inf, l = 0, O = 0).
  __syncthreads();  // every warp is done with its ring
  const int rows = hr.rows;
  float* sO = reinterpret_cast<float*>(mma_smem);  // [kMmaWarps][rows][kHd]
  float* sM = sO + kMmaWarps * rows * kHd;     // [kMmaWarps][rows]
  float* sL = sM + kMmaWarps * rows;           // [kMmaWarps][rows]
  if (g < rows) {
    float* row = sO + (warp * rows + g) * kHd;
#pragma unroll
    for (int n = 0; n < kNTiles; ++n) {
      if constexpr (k8) {  // columns 2 qd, 2 qd + 1 of tile n: dims 4 (8 (n / 4) + col) + n % 4
        row[4 * (8 * (n / 4) + 2 * qd) + n % 4] = o[n][0];
        row[4 * (8 * (n / 4) + 2 * qd + 1) + n % 4] = o[n][1];
      } else {
        row[8 * n + 2 * qd] = o[n][0];
        row[8 * n + 2 * qd + 1] = o[n][1];
      }
    }
    if (qd == 0) {
      sM[warp * rows + g] = m_run;
      sL[warp * rows + g] = l_run;
    }
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rows * kHd; i += kMmaThreads) {
    const int h = i / kHd;
    const int d = i - h * kHd;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w) mx = fmaxf(mx, sM[w * rows + h]);
    float lsum = 0.0f, asum = 0.0f;
    if (mx != -INFINITY) {
#pragma unroll
      for (int w = 0; w < kMmaWarps; ++w) {
        const float wt = exp2f(sM[w * rows + h] - mx);  // 0 for warps without keys
        lsum += wt * sL[w * rows + h];
        asum += wt * sO[(w * rows + h) * kHd + d];
      }
    }
    if constexpr (kF8) asum *= a.v_scale;
    const int head = hr.head0 + h;
    if (a.num_splits == 1) {
      T* out = static_cast<T*>(a.out) + (static_cast<int64_t>(token) * a.hq + head) * kHd;
      out[d] = from_float<T>(lsum > 0.0f ? asum / lsum : 0.0f);
    } else {
      const int64_t idx = (static_cast<int64_t>(split) * a.num_tokens + token) * a.hq + head;
      a.part_acc[idx * kHd + d] = asum;
      if (d == 0) {
        a.part_ml[idx * 2] = mx == -INFINITY ? -INFINITY : mx * kLn2;  // natural-log units for the merge
        a.part_ml[idx * 2 + 1] = lsum;
      }
    }
  }
  if (a.num_splits > 1 && a.split_tickets != nullptr) {
    merge_splits_if_last<kHd, T>(a, hr, token, chunk > 0 ? (span + chunk - 1) / chunk : 0,
                                 reinterpret_cast<float*>(mma_smem));
  }
}

template <int kHd, class T, class KvT>
void launch_mma(const PagedAttentionArgs& a, cudaStream_t stream) {
  constexpr size_t smem = mma_smem_bytes<kHd, kMmaMaxRows, static_cast<int>(sizeof(KvT)), mma_scale_bytes<KvT>()>();
  auto kernel = mma_decode_kernel<kHd, T, KvT>;
  if constexpr (smem > 48 * 1024) set_max_dynamic_smem_once(kernel, smem);
  const dim3 grid(static_cast<unsigned>(a.num_seqs), static_cast<unsigned>(mma_grid_y(a)),
                  static_cast<unsigned>(a.num_splits));
  // Programmatic dependent launch: the copies of earlier positions' K/V
  // start while qkv_rope_kv_write (which triggers at its start) still runs.
  launch_pdl_if(attention_pdl_enabled(), kernel, grid, dim3(kMmaThreads), smem, stream, a);
}

// ---- selection -------------------------------------------------------------------

// The tensor-core kernel takes any G (rows of its MMAs, parts of a KV head
// past 8); the SIMT kernel is compiled for G = 1, 2, 4 and 8.
template <int kHd, class KvT, class QT>
void launch_for_group(const PagedAttentionArgs& a, bool mma, cudaStream_t stream) {
  if constexpr ((std::is_same_v<KvT, QT> || kIsKvF8<KvT> || kIsKvI8<KvT>) && !std::is_same_v<QT, float>) {
    if (mma) {
      launch_mma<kHd, QT, KvT>(a, stream);
      return;
    }
  }
  if constexpr (kIsKvI8<KvT>) {
    OSP_CHECK_MSG(false, "I8 KV pages take the tensor-core decode kernel only (BF16 or F16 q)");
  } else {
    switch (a.hq / a.hk) {
      case 1:
        launch_simt<kHd, 1, KvT, QT>(a, stream);
        break;
      case 2:
        launch_simt<kHd, 2, KvT, QT>(a, stream);
        break;
      case 4:
        launch_simt<kHd, 4, KvT, QT>(a, stream);
        break;
      default:
        launch_simt<kHd, 8, KvT, QT>(a, stream);
        break;
    }
  }
}

bool simt_forced() {
  static const bool forced = env_equals("OSPREY_DECODE_ATTENTION", "simt");
  return forced;
}

// The tensor-core kernel takes this step (decode_attention_supported holds).
bool use_mma(const PagedAttentionArgs& a) {
  return (a.act == DType::kBF16 || a.act == DType::kF16) &&
         (a.kv_dtype == a.act || a.kv_dtype == DType::kF8E4M3 || a.kv_dtype == DType::kI8) &&
         (!simt_forced() || a.kv_dtype == DType::kI8);
}

// Split plan. The SIMT kernel: >= 2 blocks per SM, splits of >= 64 keys.
// The tensor-core kernel: split only until there is one block per SM (2
// fit per SM at hd 128: 96 KB of stages each; 156 registers per thread
// would allow 3), splits of >=
// kMmaMinKeysPerDecodeSplit keys (one tile per warp). Measured on an H200
// (gpu_op_bench decode-attention, forced splits): every split beyond that
// costs more in partial writes, the merge kernel and per-block start-up
// than the extra blocks gain, e.g. 56 seqs x
// 544 keys 38.6 us unsplit vs 45.8 us in 2 splits; 8 x 4096 best at 3-4
// splits (64 blocks), 1 x 16384 at 16-32.
// Two stages per warp instead of three (64 KB, 3 blocks per SM) were
// measured for grids above 2 blocks per SM on an H100 and not kept: 1-3%
// faster at serving's 68-200 x 320, up to 6% slower at 64 x 4096, decode
// steps and the online run within noise (docs/PERF.md, session 7).
constexpr int kSimtBlocksPerSm = 2;
constexpr int kMmaBlocksPerSm = 1;
constexpr int kMinKeysPerDecodeSplit = 64;
constexpr int kMaxDecodeSplits = 64;
static_assert(kMaxDecodeSplits <= kMaxDecodeSplitsMerged, "the in-kernel merge takes every planned split count");
// The tensor-core kernel's minimum keys per split. Measured on an H100
// (model_bench, batch 1): 128 and 256 gain nothing at 2048 keys, 256 costs
// 0.05 ms per step at 512 keys (fewer blocks, longer chains), 512 costs 0.1
// ms at 2048 (docs/cuda.md).
constexpr int kMmaMinKeysPerDecodeSplit = 64;

int mma_min_keys_per_split() {
  static const int keys = [] {
    const int k = static_cast<int>(env_int("OSPREY_DECODE_MIN_KEYS", 0, INT_MAX, kMmaMinKeysPerDecodeSplit));
    return std::max(kTileKeys, (k + kTileKeys - 1) / kTileKeys * kTileKeys);
  }();
  return keys;
}

bool merge_kernel_forced() {
  static const bool forced = env_equals("OSPREY_DECODE_MERGE", "kernel");
  return forced;
}

}  // namespace

bool decode_attention_supported(const PagedAttentionArgs& a) {
  const int g = a.hk > 0 ? a.hq / a.hk : 0;
  const bool group_ok = use_mma(a) ? g >= 1 && mma_grid_y(a) <= 65535
                                   : g == 1 || g == 2 || g == 4 || g == 8;
  return (a.hd == 64 || a.hd == 128) && group_ok && a.hq == g * a.hk &&
         aligned16(a.k_cache) && aligned16(a.v_cache) &&
         (a.act == DType::kF32 || a.act == DType::kBF16 || a.act == DType::kF16) &&
         ops::is_kv_page_dtype(a.kv_dtype) &&
         (a.kv_dtype != DType::kI8 || (a.act != DType::kF32 && a.k_row_scales && a.v_row_scales));
}

int64_t decode_blocks_per_split(const PagedAttentionArgs& a) {
  const int64_t per_seq = use_mma(a) && a.hk > 0 ? mma_grid_y(a) : a.hk;
  return int64_t{a.num_seqs} * per_seq;
}

void plan_decode_splits(PagedAttentionArgs& a, int num_sms) {
  const int64_t blocks = std::max<int64_t>(1, decode_blocks_per_split(a));
  const int64_t target = int64_t{use_mma(a) ? kMmaBlocksPerSm : kSimtBlocksPerSm} * std::max(1, num_sms);
  a.num_splits = static_cast<int>(std::clamp<int64_t>((target + blocks - 1) / blocks, 1, kMaxDecodeSplits));
  a.min_keys_per_split = use_mma(a) ? mma_min_keys_per_split() : kMinKeysPerDecodeSplit;
}

void launch_decode_attention(const PagedAttentionArgs& a, cudaStream_t stream) {
  OSP_CHECK(decode_attention_supported(a));
  OSP_CHECK(a.num_tokens == a.num_seqs);
  OSP_CHECK(a.num_splits == 1 || (a.part_acc != nullptr && a.part_ml != nullptr));
  if (a.num_seqs == 0) return;
  const bool mma = use_mma(a);
  PagedAttentionArgs k = a;
  if (!mma || k.num_splits <= 1 || k.num_splits > kMaxDecodeSplitsMerged || merge_kernel_forced()) {
    k.split_tickets = nullptr;  // the combine kernel merges
  }
  OSP_DISPATCH_ACT(k.act, QT, OSP_DISPATCH_KV8(k.kv_dtype, KvT, {
                     if (k.hd == 64) {
                       launch_for_group<64, KvT, QT>(k, mma, stream);
                     } else {
                       launch_for_group<128, KvT, QT>(k, mma, stream);
                     }
                   }));
  if (k.num_splits > 1 && k.split_tickets == nullptr) launch_combine_splits(k, stream);
}

}  // namespace osprey::cuda
