// Paged attention for prefill (and mixed / chunked-prefill) steps, register
// resident, FlashAttention-2 style: 16-bit q, out and pages of one type T
// (BF16 or F16), head_dim 64 or 128, mma.sync m16n8k16 (T in, fp32
// accumulate; P is rounded to T for P V).
//
// Work tile: kM = 16 * kR * kWarps rows (64 to 256) of one sequence and one
// KV head, row r = (query token r / G, query head kv_head * G + r % G),
// G = hq / hk, so the query heads sharing a KV head read each K/V tile once
// (GQA/MQA). Each warp owns 16 * kR rows (kR = 1 or 2); S = Q K^T, the
// online-softmax state (row max, row sum) and O stay in registers for the
// whole key loop, and Q too when kQRegs. K/V tiles of kN = 32 to 128 keys
// are gathered through the page table with cp.async (16 bytes, zero-filled
// past the key range) into a double-buffered, padded shared-memory ring:
// tile t+1 loads while tile t computes; the KV slots of tile t+2's keys are
// looked up in the page table during tile t (into a small shared ring), so
// issuing a tile's copies never waits on a global load. A warp skips a key
// tile that none of its rows can see (causal / window / length), and masks
// only tiles that straddle one of its rows' ranges (kept in shared memory,
// not registers). Softmax in the log2 domain with the scale folded into one
// FMA per score (requires scale > 0: max commutes with the scaling); O is
// rescaled only when some row of the warp got a new maximum (exact: the
// factor is 1 otherwise), which after the first few tiles is rare.
// Row r sees keys [max(0, pos - window + 1) if window else 0,
// min(pos + 1, kv_len)), pos = positions[token]: earlier pages (prefix
// cache, earlier chunks) and variable lengths need nothing else. Rows
// without keys get 0. The block shapes (launch_variant) compute the same
// function; launch_prefill_attention_mma picks one per step.
// F8_E4M3 pages (kF8; q and out BF16 or F16): a key tile's bytes are copied
// with cp.async into a staging area (one tile: it is converted before the
// next tile's copies start), then every thread converts its share into the
// 16-bit tile ring (the e4m3 values are exact in BF16 and F16), and the
// rest is the kernel above; the K scale goes on the scores and the V scale
// on the output. I8 pages (kKv8 == 2): the same staging, with each key's K
// and V row scales staged beside the tile (4-byte cp.async), and the
// conversion writes q * the row's scale rounded to the 16-bit type (the
// per-layer scales are 1 then).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <type_traits>

#include "backend/cuda/attention/kv_fp8.cuh"
#include "backend/cuda/attention/mma_ptx.cuh"
#include "backend/cuda/attention/prefill_attention_mma.h"
#include "backend/cuda/attention/prefill_rows.cuh"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_query.h"

namespace osprey::cuda {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

// Block shape: kWarps warps of 16 * kR rows each (kM rows per block), key
// tiles of kN.
// kKv8: 0 for 16-bit pages, 1 for F8_E4M3, 2 for I8 (one byte a value, staged and widened).
template <int kHd, int kWarps, int kR, int kN, int kKv8 = 0>
struct MmaLayout {
  static constexpr int kM = 16 * kR * kWarps;
  static constexpr int kP = kHd + 8;  // element pitch of sQ, sK, sV rows (16-byte pad: conflict-free ldmatrix)
  static constexpr size_t q = 0;      // sQ [kM][kP]; reused to stage the output
  static constexpr size_t k = q + sizeof(uint16_t) * kM * kP;          // sK [2][kN][kP]
  static constexpr size_t v = k + 2 * sizeof(uint16_t) * kN * kP;      // sV [2][kN][kP]
  static constexpr size_t range = v + 2 * sizeof(uint16_t) * kN * kP;  // int [kWarps][2]
  static constexpr size_t slot = range + sizeof(int) * kWarps * 2;  // int [2][kN]: KV slot per key, -1 past the range
  static constexpr size_t rows = slot + sizeof(int) * 2 * kN;       // int [2][kM]: each row's key range [lo, hi)
  static constexpr size_t stage = rows + sizeof(int) * 2 * kM;  // F8, I8: [K, V][kN][kHd] bytes, 16-byte aligned
  static constexpr size_t scales = stage + (kKv8 ? size_t{2} * kN * kHd : 0);  // I8: float [K, V][kN] row scales
  static constexpr size_t bytes = scales + (kKv8 == 2 ? sizeof(float) * 2 * kN : 0);
};

// The 16-bit element type T's MMA and packing: c[16x8] += a[16x16] b[16x8]
// with T operands and fp32 accumulators (m16n8k16, A row-major, B
// column-major fragments as ldmatrix gives them); pack rounds two floats to
// T (lo in the low half).
template <class T>
struct Mma;
template <>
struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
};
template <>
struct Mma<__half> {
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
};

// Key range [lo, hi) of global row grow; empty rows get [INT_MAX, INT_MIN).
__device__ __forceinline__ void row_range(const PagedAttentionArgs& a, int q_begin, int group, int total_rows,
                                          int kv_len, int grow, int& lo, int& hi) {
  lo = INT_MAX;
  hi = INT_MIN;
  if (grow >= total_rows) return;
  const int pos = a.positions[q_begin + grow / group];
  const int h = min(pos + 1, kv_len);
  const int l = a.window > 0 ? max(0, pos - a.window + 1) : 0;
  if (h > l) {
    lo = l;
    hi = h;
  }
}

// kQRegs: Q fragments live in registers for the whole key loop (else they
// are re-read from shared memory at each k step, to save registers);
// kMinBlocks: blocks per SM the register allocation must allow.
template <class T, int kHd, int kWarps, int kR, int kN, bool kQRegs, int kMinBlocks, int kKv8>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    prefill_attention_mma_kernel(PagedAttentionArgs a, int tiles_per_seq, PrefillOrder order) {
  using L = MmaLayout<kHd, kWarps, kR, kN, kKv8>;
  constexpr bool kF8 = kKv8 != 0;  // one byte a value: staged, then widened (the layer scales are 1 for I8)
  constexpr bool kI8 = kKv8 == 2;
  static_assert(L::stage % 16 == 0, "the staging area takes 16-byte copies");
  using M = Mma<T>;
  constexpr int kM = L::kM;
  constexpr int kThreads = kWarps * 32;
  constexpr int kP = L::kP;
  constexpr int kChunks = kHd / 8;  // 16-byte chunks per row
  constexpr int kDT = kHd / 8;      // n8 tiles of O
  constexpr int kST = kN / 8;       // n8 tiles of S
  constexpr bool kQInRegs = kQRegs;
  static_assert(kN * kChunks % kThreads == 0, "K/V tile copy");
  static_assert(!kQRegs || kR == 1, "Q fragments in registers hold one m16 tile");
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem + L::q);
  T* sK = reinterpret_cast<T*>(smem + L::k);
  T* sV = reinterpret_cast<T*>(smem + L::v);
  int* sRange = reinterpret_cast<int*>(smem + L::range);
  int* sSlot = reinterpret_cast<int*>(smem + L::slot);
  int* sRows = reinterpret_cast<int*>(smem + L::rows);  // lo of row r at [r], hi at [kM + r]

  // Later row tiles see more keys (causal): start them first. Blocks are
  // issued in blockIdx.x order, so the linear block index runs over the row
  // tiles from the last one down, (sequence, KV head) fastest
  // (kLongestFirst; every KV head's last tile before any shorter one), or
  // KV head slowest (kPerHead: each head's tiles long to short in turn).
  const int b = static_cast<int>(blockIdx.x);
  int seq, kvh, tile;
  if (order == PrefillOrder::kLongestFirst) {
    prefill_block_longest_first(a, tiles_per_seq, b, seq, kvh, tile);
  } else {
    const int per_head = a.num_seqs * tiles_per_seq;
    kvh = b / per_head;
    const int rem = b - kvh * per_head;
    seq = rem / tiles_per_seq;
    tile = tiles_per_seq - 1 - (rem - seq * tiles_per_seq);
  }
  const PrefillRows rows = prefill_rows(a, seq, tile, kM);
  const auto [group, q_begin, total_rows, row0] = rows;
  if (row0 >= total_rows) return;  // uniform over the block
  const int kv_len = a.kv_lens[seq];
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;          // accumulator row within the 8-row half
  const int t4 = lane & 3;          // accumulator column pair
  const int wrow = warp * 16 * kR;  // first row of this warp within the block

  // q -> sQ (zeros past the sequence's rows).
  const T* q = static_cast<const T*>(a.q);
  for (int i = tid; i < kM * kChunks; i += kThreads) {
    const int r = i / kChunks;
    const int c = i - r * kChunks;
    const T* src = prefill_q_chunk<T, kHd>(a, rows, kvh, r, c);
    cp_async16(sQ + r * kP + c * 8, src != nullptr ? src : q, src != nullptr ? 16 : 0);
  }
  cp_async_commit();

  // This thread's rows: wrow + 16 * r + g + 8 * h, h in {0, 1}; the warp's
  // span. The per-row ranges go to shared memory (read only when a tile
  // straddles them), which keeps registers for the accumulators.
  int wlo = INT_MAX, whi = INT_MIN, wmaxlo = INT_MIN, wminhi = INT_MAX;
#pragma unroll
  for (int r = 0; r < kR; ++r) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int lo, hi;
      const int brow = wrow + 16 * r + g + 8 * h;
      row_range(a, q_begin, group, total_rows, kv_len, row0 + brow, lo, hi);
      if (t4 == 0) {
        sRows[brow] = lo;
        sRows[kM + brow] = hi;
      }
      wlo = min(wlo, lo);
      whi = max(whi, hi);
      wmaxlo = max(wmaxlo, lo);
      wminhi = min(wminhi, hi);
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, o));
    whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, o));
    wmaxlo = max(wmaxlo, __shfl_xor_sync(0xffffffffu, wmaxlo, o));
    wminhi = min(wminhi, __shfl_xor_sync(0xffffffffu, wminhi, o));
  }
  if (lane == 0) {
    sRange[warp * 2] = wlo;
    sRange[warp * 2 + 1] = whi;
  }
  cp_async_wait<0>();
  __syncthreads();
  int tile_lo = INT_MAX, tile_hi = INT_MIN;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    tile_lo = min(tile_lo, sRange[w * 2]);
    tile_hi = max(tile_hi, sRange[w * 2 + 1]);
  }

  // Q fragments (kQRegs) of the warp's rows.
  const int q_lrow = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int q_lcol = (lane >> 4) * 8;
  uint32_t qf[kQInRegs ? kHd / 16 : 1][4];
  if constexpr (kQInRegs) {
#pragma unroll
    for (int kk = 0; kk < kHd / 16; ++kk) ldmatrix_x4(qf[kk], sQ + (wrow + q_lrow) * kP + kk * 16 + q_lcol);
  }

  float o[kR][kDT][4];
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int i = 0; i < kDT; ++i) o[r][i][0] = o[r][i][1] = o[r][i][2] = o[r][i][3] = 0.0f;
  float m[kR][2], l[kR][2];  // running max (log2 domain, scaled); this thread's share of the sums
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    m[r][0] = m[r][1] = -INFINITY;
    l[r][0] = l[r][1] = 0.0f;
  }
  const float scale2 = (kF8 ? a.scale * a.k_scale : a.scale) * kLog2e;

  const int32_t* pages = a.block_indices + a.block_indptr[seq];
  const T* kc = static_cast<const T*>(a.k_cache);
  const T* vc = static_cast<const T*>(a.v_cache);
  const int bs = a.block_size;
  const bool bs_pow2 = (bs & (bs - 1)) == 0;  // the usual case: shift and mask instead of a division
  const int bs_shift = __ffs(bs) - 1;
  const int64_t slot_stride = static_cast<int64_t>(a.hk) * kHd;
  const int64_t head_off = static_cast<int64_t>(kvh) * kHd;

  static_assert(kN <= kThreads, "one key slot per thread");
  // KV slot of key kp (-1 from tile_hi on): the page table, read from global memory.
  auto slot_of = [&](int kp) {
    if (kp >= tile_hi) return -1;
    const int page = bs_pow2 ? kp >> bs_shift : kp / bs;
    return pages[page] * bs + (kp - page * bs);
  };
  // F8: gathers keys [kb, kb + kN) (slots in sSlot[buf]) into the staging
  // area, zeros past the range; convert_tile(buf) then widens them into ring
  // slot buf.
  unsigned char* sStage = smem + L::stage;
  auto load_tile_f8 = [&](int buf) {
    constexpr int kC = kHd / 16;  // 16-byte chunks per F8 row
    const unsigned char* kb8 = static_cast<const unsigned char*>(a.k_cache);
    const unsigned char* vb8 = static_cast<const unsigned char*>(a.v_cache);
    for (int i = tid; i < kN * kC; i += kThreads) {
      const int j = i / kC;
      const int c = i - j * kC;
      const int slot = sSlot[buf * kN + j];
      const int64_t off = slot >= 0 ? static_cast<int64_t>(slot) * slot_stride + head_off + c * 16 : 0;
      cp_async16(sStage + j * kHd + c * 16, kb8 + off, slot >= 0 ? 16 : 0);
      cp_async16(sStage + (kN + j) * kHd + c * 16, vb8 + off, slot >= 0 ? 16 : 0);
    }
    if constexpr (kI8) {  // the keys' K, then V row scales (0 past the range)
      float* sScale = reinterpret_cast<float*>(smem + L::scales);
      for (int i = tid; i < 2 * kN; i += kThreads) {
        const int j = i < kN ? i : i - kN;
        const int slot = sSlot[buf * kN + j];
        const float* rs = i < kN ? a.k_row_scales : a.v_row_scales;
        cp_async4(sScale + i, rs + (slot >= 0 ? ops::kv_row_scale_index(slot, kvh, a.hk, bs) : 0), slot >= 0 ? 4 : 0);
      }
    }
    cp_async_commit();
  };
  auto convert_tile = [&](int buf) {
    T* dk = sK + buf * kN * kP;
    T* dv = sV + buf * kN * kP;
    for (int i = tid; i < 2 * kN * (kHd / 8); i += kThreads) {
      const int row = i / (kHd / 8);  // K rows, then V rows
      const int c = i - row * (kHd / 8);
      const uint2 w = *reinterpret_cast<const uint2*>(sStage + row * kHd + c * 8);
      float f[8];
      if constexpr (kI8) {
        const float sc = reinterpret_cast<const float*>(smem + L::scales)[row];  // K rows, then V rows
        i8x4_to_float(w.x, f);
        i8x4_to_float(w.y, f + 4);
#pragma unroll
        for (int e = 0; e < 8; ++e) f[e] *= sc;
      } else {
        e4m3x4_to_float(w.x, f);
        e4m3x4_to_float(w.y, f + 4);
      }
      T* dst = (row < kN ? dk + row * kP : dv + (row - kN) * kP) + c * 8;
      store8_act(dst, f);
    }
  };
  // Gathers keys [kb, kb + kN) (slots in sSlot[buf]) into ring slot buf;
  // keys past the range are zeros.
  auto load_tile = [&](int buf) {
    if constexpr (kF8) {
      load_tile_f8(buf);
      return;
    }
    T* dk = sK + buf * kN * kP;
    T* dv = sV + buf * kN * kP;
#pragma unroll
    for (int n = 0; n < kN * kChunks / kThreads; ++n) {
      const int i = tid + n * kThreads;
      const int j = i / kChunks;
      const int c = i - j * kChunks;
      const int slot = sSlot[buf * kN + j];
      const T* srck = kc;
      const T* srcv = vc;
      int bytes = 0;
      if (slot >= 0) {
        const int64_t off = static_cast<int64_t>(slot) * slot_stride + head_off + c * 8;
        srck = kc + off;
        srcv = vc + off;
        bytes = 16;
      }
      cp_async16(dk + j * kP + c * 8, srck, bytes);
      cp_async16(dv + j * kP + c * 8, srcv, bytes);
    }
    cp_async_commit();
  };

  if (tile_lo < tile_hi) {  // block-uniform
    if (tid < kN) {
      sSlot[tid] = slot_of(tile_lo + tid);
      sSlot[kN + tid] = slot_of(tile_lo + kN + tid);
    }
    __syncthreads();
    load_tile(0);
  }
  int buf = 0;
  for (int kb = tile_lo; kb < tile_hi; kb += kN, buf ^= 1) {
    cp_async_wait<0>();
    // Tile kb landed for all; every warp is done with the other ring slot,
    // and sSlot[buf ^ 1] (stored an iteration ago) is visible.
    __syncthreads();
    if constexpr (kF8) {  // staging -> ring slot buf; the staging area is free after the barrier
      convert_tile(buf);
      __syncthreads();
    }
    const bool more = kb + kN < tile_hi;
    int next_slot = -1;  // key kb + 2 kN + tid: loaded now, stored into sSlot[buf] after this tile's compute
    if (more) {
      load_tile(buf ^ 1);
      if (tid < kN) next_slot = slot_of(kb + 2 * kN + tid);
    }
    // sSlot[buf] (tile kb's slots) was last read before the barrier above.
    auto store_next_slot = [&] {
      if (more && tid < kN) sSlot[buf * kN + tid] = next_slot;
    };
    if (kb >= whi || kb + kN <= wlo) {  // warp-uniform: no row of this warp sees these keys
      store_next_slot();
      continue;
    }
    const T* tk = sK + buf * kN * kP;
    const T* tv = sV + buf * kN * kP;

    // S[16 kR, kN] = Q K^T.
    float s[kR][kST][4];
#pragma unroll
    for (int r = 0; r < kR; ++r)
#pragma unroll
      for (int i = 0; i < kST; ++i) s[r][i][0] = s[r][i][1] = s[r][i][2] = s[r][i][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kHd / 16; ++kk) {
      uint32_t qa[kR][4];
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        if constexpr (kQInRegs) {
#pragma unroll
          for (int e = 0; e < 4; ++e) qa[r][e] = qf[kk][e];
        } else {
          ldmatrix_x4(qa[r], sQ + (wrow + 16 * r + q_lrow) * kP + kk * 16 + q_lcol);
        }
      }
#pragma unroll
      for (int np = 0; np < kST / 2; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, tk + (np * 16 + (lane & 7) + (lane >> 4) * 8) * kP + kk * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          M::mma(s[r][2 * np], qa[r], b[0], b[1]);
          M::mma(s[r][2 * np + 1], qa[r], b[2], b[3]);
        }
      }
    }

    // Mask, online softmax (log2 domain, scale folded into the exponent's
    // FMA); P (rounded to T) packed as the A operand of P V.
    const bool full = kb >= wmaxlo && kb + kN <= wminhi;
    uint32_t pa[kR][kN / 16][4];
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      if (!full) {
        int rlo[2], rhi[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          rlo[h] = sRows[wrow + 16 * r + g + 8 * h];
          rhi[h] = sRows[kM + wrow + 16 * r + g + 8 * h];
        }
#pragma unroll
        for (int i = 0; i < kST; ++i) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int col = kb + i * 8 + t4 * 2 + (e & 1);
            if (col < rlo[e >> 1] || col >= rhi[e >> 1]) s[r][i][e] = -INFINITY;
          }
        }
      }
      float mx[2] = {-INFINITY, -INFINITY};  // of the raw scores
#pragma unroll
      for (int i = 0; i < kST; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) mx[e >> 1] = fmaxf(mx[e >> 1], s[r][i][e]);
      }
      float mu[2], alpha[2];
      bool grew = false;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
        mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        const float mn = fmaxf(m[r][h], mx[h] * scale2);  // scale2 > 0, so max(s) * scale2 = max(s * scale2)
        grew |= mn != m[r][h];
        // A row with no key so far keeps max -inf: subtract 0 so p = exp2(-inf) = 0.
        mu[h] = mn == -INFINITY ? 0.0f : mn;
        alpha[h] = fast_exp2(m[r][h] - mu[h]);
        m[r][h] = mn;
      }
      float ps[2] = {0.0f, 0.0f};
#pragma unroll
      for (int i = 0; i < kST; ++i) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[r][i][e] = fast_exp2(fmaf(s[r][i][e], scale2, -mu[e >> 1]));
          ps[e >> 1] += s[r][i][e];
        }
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) l[r][h] = l[r][h] * alpha[h] + ps[h];
      // alpha == 1 exactly for rows whose max did not grow: skip the O
      // rescale when that holds for the whole warp (warp-uniform branch).
      if (__any_sync(0xffffffffu, grew)) {
#pragma unroll
        for (int i = 0; i < kDT; ++i) {
          o[r][i][0] *= alpha[0];
          o[r][i][1] *= alpha[0];
          o[r][i][2] *= alpha[1];
          o[r][i][3] *= alpha[1];
        }
      }
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk) {
        pa[r][kk][0] = M::pack(s[r][2 * kk][0], s[r][2 * kk][1]);
        pa[r][kk][1] = M::pack(s[r][2 * kk][2], s[r][2 * kk][3]);
        pa[r][kk][2] = M::pack(s[r][2 * kk + 1][0], s[r][2 * kk + 1][1]);
        pa[r][kk][3] = M::pack(s[r][2 * kk + 1][2], s[r][2 * kk + 1][3]);
      }
    }

    // O[16 kR, hd] += P[16 kR, kN] V[kN, hd].
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
#pragma unroll
      for (int dp = 0; dp < kDT / 2; ++dp) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, tv + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kP + dp * 16 + (lane >> 4) * 8);
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          M::mma(o[r][2 * dp], pa[r][kk], b[0], b[1]);
          M::mma(o[r][2 * dp + 1], pa[r][kk], b[2], b[3]);
        }
      }
    }
    store_next_slot();
  }

  // out = O / l, staged through the warp's own rows of sQ for 16-byte stores.
  T* stage = sQ + wrow * kP;  // only this warp ever read these rows
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = l[r][h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      inv[h] = sum > 0.0f ? (kF8 ? a.v_scale : 1.0f) / sum : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < kDT; ++i) {
      *reinterpret_cast<uint32_t*>(stage + (16 * r + g) * kP + i * 8 + t4 * 2) =
          M::pack(o[r][i][0] * inv[0], o[r][i][1] * inv[0]);
      *reinterpret_cast<uint32_t*>(stage + (16 * r + g + 8) * kP + i * 8 + t4 * 2) =
          M::pack(o[r][i][2] * inv[1], o[r][i][3] * inv[1]);
    }
  }
  __syncwarp();
  T* out = static_cast<T*>(a.out);
  for (int i = lane; i < 16 * kR * kChunks; i += 32) {
    const int r = i / kChunks;
    const int c = i - r * kChunks;
    const int64_t off = prefill_row_offset<kHd>(a, rows, kvh, wrow + r);
    if (off < 0) continue;
    *reinterpret_cast<uint4*>(out + off + c * 8) = *reinterpret_cast<const uint4*>(stage + r * kP + c * 8);
  }
}

template <class T, int kHd, int kWarps, int kR, int kN, bool kQRegs, int kMinBlocks, int kKv8>
void launch_mma_typed(const PagedAttentionArgs& a, cudaStream_t stream, PrefillOrder order) {
  using L = MmaLayout<kHd, kWarps, kR, kN, kKv8>;
  const int group = a.hq / a.hk;
  const int tiles = static_cast<int>((int64_t{a.max_q_len} * group + L::kM - 1) / L::kM);
  const int64_t blocks = static_cast<int64_t>(a.num_seqs) * tiles * a.hk;
  OSP_CHECK_LE(blocks, int64_t{2147483647});
  auto kernel = prefill_attention_mma_kernel<T, kHd, kWarps, kR, kN, kQRegs, kMinBlocks, kKv8>;
  set_max_dynamic_smem_once(kernel, L::bytes);
  kernel<<<static_cast<unsigned>(blocks), kWarps * 32, L::bytes, stream>>>(a, tiles, order);
  OSP_CUDA_CHECK_LAUNCH();
}

template <class T, int kHd, int kKv8>
void launch_variant(const PagedAttentionArgs& a, cudaStream_t stream, int variant, PrefillOrder order) {
  switch (variant) {
    case 1:
      return launch_mma_typed<T, kHd, 4, 1, 64, true, 2, kKv8>(a, stream, order);
    case 2:
      return launch_mma_typed<T, kHd, 8, 1, 64, true, 1, kKv8>(a, stream, order);
    case 3:
      return launch_mma_typed<T, kHd, 4, 2, 32, false, 1, kKv8>(a, stream, order);
    case 4:
      return launch_mma_typed<T, kHd, 4, 2, 64, false, 1, kKv8>(a, stream, order);
    case 5:
      return launch_mma_typed<T, kHd, 8, 2, 32, false, 1, kKv8>(a, stream, order);
    case 7:
      return launch_mma_typed<T, kHd, 8, 1, 128, true, 1, kKv8>(a, stream, order);
    case 8:
      return launch_mma_typed<T, kHd, 12, 1, 48, false, 1, kKv8>(a, stream, order);
    case 9:
      return launch_mma_typed<T, kHd, 4, 2, 48, false, 1, kKv8>(a, stream, order);
    case 10:  // 48 keys x 16 chunks of hd 128 split evenly over 256 threads; 64 keys at hd 64
      return launch_mma_typed < T, kHd, 8, 2, kHd == 128 ? 48 : 64, false, 1, kKv8> (a, stream, order);
    default:
      return launch_mma_typed<T, kHd, 4, 1, 32, false, 3, kKv8>(a, stream, order);
  }
}

}  // namespace

void launch_prefill_attention_mma(const PagedAttentionArgs& a, cudaStream_t stream, int variant, PrefillOrder order) {
  OSP_CHECK(a.hd == 64 || a.hd == 128);
  OSP_CHECK((a.act == DType::kBF16 || a.act == DType::kF16) &&
            (a.kv_dtype == a.act || a.kv_dtype == DType::kF8E4M3 || a.kv_dtype == DType::kI8));
  OSP_CHECK(variant >= 0 && variant < kNumPrefillMmaVariants);
  if (variant == 0) {
    // 64-row blocks for short prompts; 128-row blocks of 8 warps x 16 rows
    // with 128-key tiles while that gives few waves; 4 warps x 32 rows
    // (48-key tiles at hd 128, 64 at hd 64) once there are more. Measured
    // on an H100 (2026-11-26, every shape in one run; causal, hq 32 / hk 8,
    // longest-first order), TFLOP/s 8 x 16 rows against 4 x 32: hd 128,
    // 1 x 1k tokens (256 wide blocks) 164 against 134; 512 tokens after
    // 3584 (128) 244 against 183; 1 x 2k (512) 221 against 251; 1 x 4k
    // (1024) 261 against 290; 1 x 8k, 4 x 2k 4 x 32 by 10-14%; hd 64, 1 x 4k
    // (1024) 223 against 246. The longest-first order took away the tail
    // that had favoured 8 x 16 up to 2048 wide blocks (H200, per-head order).
    const int64_t rows = int64_t{a.max_q_len} * (a.hq / a.hk);
    const int64_t wide_blocks = int64_t{a.num_seqs} * ((rows + 127) / 128) * a.hk;
    if (rows < kRowsForWideTiles) {
      variant = 1;
    } else if (wide_blocks < (a.hd == 64 ? kBlocksForTallWarpsHd64 : kBlocksForTallWarps)) {
      variant = 7;
    } else {
      variant = a.hd == 64 ? 4 : 9;
    }
  }
  auto by_hd = [&](auto t, auto f8) {
    using T = decltype(t);
    if (a.hd == 64) {
      launch_variant<T, 64, decltype(f8)::value>(a, stream, variant, order);
    } else {
      launch_variant<T, 128, decltype(f8)::value>(a, stream, variant, order);
    }
  };
  auto by_kv = [&](auto t) {
    if (a.kv_dtype == DType::kF8E4M3) {
      by_hd(t, std::integral_constant<int, 1>{});
    } else if (a.kv_dtype == DType::kI8) {
      OSP_CHECK(a.k_row_scales != nullptr && a.v_row_scales != nullptr);
      by_hd(t, std::integral_constant<int, 2>{});
    } else {
      by_hd(t, std::integral_constant<int, 0>{});
    }
  };
  if (a.act == DType::kF16) {
    by_kv(__half{});
  } else {
    by_kv(__nv_bfloat16{});
  }
}

}  // namespace osprey::cuda
