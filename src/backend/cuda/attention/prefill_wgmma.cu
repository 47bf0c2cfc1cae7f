// Paged prefill attention on Hopper warpgroup MMA (wgmma, sm_90a): 16-bit q,
// out and pages of one type T (BF16 or F16), head_dim 128, no sliding
// window; the same function as prefill_attention_mma.cu (FlashAttention-2
// arithmetic: fp32 scores and accumulators, online softmax in exp2 with the
// scale folded in, P rounded to T for P V).
//
// Work tile: kM = 128 rows of one sequence and one KV head, row r = (query
// token r / G, query head kv_head * G + r % G), G = hq / hk, so the G query
// heads of a KV head share every K/V tile. Two warpgroups of 4 warps, each
// owning 64 rows: S[64 x 128 keys] = Q K^T as wgmma m64n128k16 with Q and K
// from shared memory (8 k-steps over d), O[64 x 128] += P V with P straight
// from the S accumulators in registers (rounded to T in place: the
// accumulator layout of S is the A-fragment layout of P) and V from shared
// memory through the transposed-B descriptor. S, O and the softmax state
// stay in registers for the whole key loop.
//
// Pipeline per key tile t (kN = 128 keys), all 256 threads copying:
//   top:    cp.async of K_t and V_{t-1} landed, fence.proxy.async, barrier
//   issue:  S_t = Q K_t^T, then O += P_{t-1} V_{t-1} (both asynchronous;
//           kPvLate, the default variant 4: P V only after the copies)
//   copies: K_{t+1} and V_t gathered through the page table with 16-byte
//           cp.async (zeros past the block's key range) into two-deep
//           K and V rings, while the tensor cores work; page-table
//           entries of tile t+2 fetched meanwhile
//   wait S: mask (only tiles straddling a row's end), row max, exp2, sums
//           (runs while the tensor cores still do P_{t-1} V_{t-1})
//   wait PV: rescale O, P_t = round(S_t)
// and P_{last} V_{last} after the loop. Shared-memory tiles use the 128-byte
// swizzle of the wgmma descriptors: two 64-element column panels of 128-byte
// rows, the 16-byte chunk c of row r stored at chunk c ^ (r % 8), tiles on
// 1024-byte boundaries (prefill_wgmma.cuh).
//
// Row r sees keys [0, min(pos + 1, kv_len)), pos = positions[token]:
// causal by position, so earlier pages (prefix cache, earlier chunks) and
// variable lengths need nothing else; rows without keys get 0. Blocks are
// issued longest-first (the last row tile of every sequence and KV head
// before any shorter one), as in the mma.sync kernel.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "backend/cuda/attention/mma_ptx.cuh"
#include "backend/cuda/attention/prefill_rows.cuh"
#include "backend/cuda/attention/prefill_wgmma.cuh"
#include "backend/cuda/attention/prefill_wgmma.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_query.h"
#include "backend/cuda/host_util.h"

namespace osprey::cuda {
namespace {

constexpr int kHd = 128;                          // head_dim: two 64-element panels
constexpr int kM = 128;                           // rows per block (2 warpgroups x 64)
constexpr int kN = 128;                           // keys per tile
constexpr int kThreads = 256;                     // 8 warps
constexpr int kChunks = kHd / 8;                  // 16-byte chunks per row
constexpr int kCopies = kN * kChunks / kThreads;  // 16-byte copies per thread per K or V tile
static_assert(kCopies * kThreads == kN * kChunks && kM * kChunks % kThreads == 0, "tile copies");
static_assert(kN <= kThreads, "one page-table entry per thread");

// Shared memory, byte offsets from a 1024-aligned base. Q, K and V tiles
// are [2 panels][rows][128 bytes] (swizzled).
constexpr uint32_t kQPanel = kM * 128;   // bytes of one Q panel
constexpr uint32_t kKvPanel = kN * 128;  // bytes of one K or V panel
constexpr uint32_t kKvTile = 2 * kKvPanel;
constexpr uint32_t kOffQ = 0;
constexpr uint32_t kOffK = kOffQ + 2 * kQPanel;  // K ring [2]
constexpr uint32_t kOffV = kOffK + 2 * kKvTile;  // V ring [2]
constexpr uint32_t kOffSlot =
    kOffV + 2 * kKvTile;  // int [3][kN]: K/V row per key (slot * hk + kv head), -1 past the range
constexpr uint32_t kOffHi = kOffSlot + 3 * kN * 4;      // int [8]: per-warp largest key bound
constexpr uint32_t kSmemBytes = kOffHi + 8 * 4 + 1024;  // + slack to align the base to 1024
static_assert(kOffK % 1024 == 0 && kOffV % 1024 == 0 && kKvPanel % 1024 == 0 && kQPanel % 1024 == 0,
              "swizzle atoms on 1024-byte boundaries");

#if OSP_WGMMA_DEVICE
// Byte offset of 16-byte chunk c (0..15) of row r in a swizzled tile whose
// panels hold `rows` rows.
__device__ __forceinline__ uint32_t swz(uint32_t rows, int r, int c) {
  return static_cast<uint32_t>(c >> 3) * rows * 128u + static_cast<uint32_t>(r) * 128u +
         (static_cast<uint32_t>((c & 7) ^ (r & 7)) << 4);
}

template <bool kF16>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (kF16) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

// Keeps x where the compiler put it relative to the waits and fences
// around (wgmma::pin of every element).
template <int kN>
__device__ __forceinline__ void pin_array(float (&x)[kN]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) wgmma::pin(x[i]);
}
__device__ __forceinline__ void pin_p(uint32_t (&pa)[8][4]) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
    for (int e = 0; e < 4; ++e) wgmma::pin(pa[kk][e]);
  }
}

// One S tile (keys kb .. kb + 127 of this thread's rows g and g + 8, hi:
// their key bounds, hi_min the smaller) through the online softmax in the
// log2 domain: masked where the tile runs past a row's end, m (scaled max)
// and l (this thread's share of the row sums) updated, S overwritten with
// P = exp2(S scale2 - m), alpha = the factor O must be scaled by.
__device__ __forceinline__ void softmax_tile(float (&s)[64], float (&m)[2], float (&l)[2], float (&alpha)[2], int kb,
                                             const int (&hi)[2], int hi_min, float scale2, int t4) {
  if (kb + kN > hi_min) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = kb + j * 8 + t4 * 2 + (e & 1);
        if (col >= hi[e >> 1]) s[4 * j + e] = -INFINITY;
      }
    }
  }
  // Four partial maxima and sums per row: shorter dependency chains.
  float mx[2][4], ps[2][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      mx[h][q] = -INFINITY;
      ps[h][q] = 0.0f;
    }
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) mx[(i >> 1) & 1][(i >> 2) & 3] = fmaxf(mx[(i >> 1) & 1][(i >> 2) & 3], s[i]);
  float mu[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float x = fmaxf(fmaxf(mx[h][0], mx[h][1]), fmaxf(mx[h][2], mx[h][3]));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
    const float mn = fmaxf(m[h], x * scale2);  // scale2 > 0: max(s) * scale2 = max(s * scale2)
    // A row with no key so far keeps max -inf: subtract 0 so p = exp2(-inf) = 0.
    mu[h] = mn == -INFINITY ? 0.0f : mn;
    alpha[h] = fast_exp2(m[h] - mu[h]);
    m[h] = mn;
  }
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    const int h = (i >> 1) & 1;
    s[i] = fast_exp2(fmaf(s[i], scale2, -mu[h]));
    ps[h][(i >> 2) & 3] += s[i];
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] = l[h] * alpha[h] + ((ps[h][0] + ps[h][1]) + (ps[h][2] + ps[h][3]));
    wgmma::pin(l[h]);
  }
  // The softmax above must run before the caller's wait for P V.
  pin_array(s);
}

__device__ __forceinline__ void rescale_o(float (&o)[64], const float (&alpha)[2]) {
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    o[4 * j + 0] *= alpha[0];
    o[4 * j + 1] *= alpha[0];
    o[4 * j + 2] *= alpha[1];
    o[4 * j + 3] *= alpha[1];
  }
}

// P (rounded to T) as the A operand of P V: k-step kk holds keys
// 16 kk .. 16 kk + 15 (the S accumulator layout is the A-fragment layout).
template <bool kF16>
__device__ __forceinline__ void pack_p(uint32_t (&pa)[8][4], const float (&s)[64]) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
    for (int e = 0; e < 4; ++e) pa[kk][e] = pack2<kF16>(s[8 * kk + 2 * e], s[8 * kk + 2 * e + 1]);
  }
}

// S[64 x 128] = Q K^T of the warpgroup whose Q rows start at q_addr (a Q
// tile of kM rows) and the K tile at k_addr, issued and committed.
template <bool kF16>
__device__ __forceinline__ void issue_s(float (&s)[64], uint32_t q_addr, uint32_t k_addr) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint32_t koff = static_cast<uint32_t>(kk & 3) * 32u;  // 16 elements along d within a panel
    wgmma::mma_ss<kF16>(s, wgmma::sw128_desc(q_addr + static_cast<uint32_t>(kk >> 2) * kQPanel + koff, 16, 1024),
                        wgmma::sw128_desc(k_addr + static_cast<uint32_t>(kk >> 2) * kKvPanel + koff, 16, 1024), kk > 0);
  }
  wgmma::commit();
}

// O[64 x 128] += P V with the V tile at v_addr, issued and committed.
template <bool kF16>
__device__ __forceinline__ void issue_pv(float (&o)[64], const uint32_t (&pa)[8][4], uint32_t v_addr) {
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    wgmma::mma_rs_tb<kF16>(o, pa[kk], wgmma::sw128_desc(v_addr + kk * 16 * 128, kKvPanel, 1024));
  }
  wgmma::commit();
}

// out = O / l for the 16 rows of this warp (block rows wrow ..), staged
// through those rows of the Q tile at smem_q (no other warp reads them, and
// every wgmma reading them has completed) for 16-byte stores.
template <bool kF16>
__device__ __forceinline__ void store_rows(const PagedAttentionArgs& a, const float (&o)[64], const float (&l)[2],
                                           unsigned char* smem_q, int wrow, int lane, const PrefillRows& rows,
                                           int kvh) {
  using T = std::conditional_t<kF16, __half, __nv_bfloat16>;
  const int g = lane >> 2;
  const int t4 = lane & 3;
  float inv[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = l[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    inv[h] = sum > 0.0f ? 1.0f / sum : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < 16; ++j) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wrow + g + 8 * h;
      *reinterpret_cast<uint32_t*>(smem_q + swz(kM, r, j) + t4 * 4) =
          pack2<kF16>(o[4 * j + 2 * h] * inv[h], o[4 * j + 2 * h + 1] * inv[h]);
    }
  }
  __syncwarp();
  T* out = static_cast<T*>(a.out);
#pragma unroll
  for (int n = 0; n < 16 * kChunks / 32; ++n) {
    const int i = lane + 32 * n;
    const int r = i / kChunks;
    const int c = i - r * kChunks;
    const int64_t off = prefill_row_offset<kHd>(a, rows, kvh, wrow + r);
    if (off < 0) continue;
    *reinterpret_cast<uint4*>(out + off + c * 8) = *reinterpret_cast<const uint4*>(smem_q + swz(kM, wrow + r, c));
  }
}
#endif  // OSP_WGMMA_DEVICE

// kPvLate: P_{t-1} V_{t-1} issued after the copies of tile t (variant 4),
// else right after S_t (variant 1).
template <bool kF16, bool kPvLate>
__global__ void __launch_bounds__(kThreads, 1) prefill_wgmma_kernel(PagedAttentionArgs a, int tiles_per_seq) {
#if OSP_WGMMA_DEVICE
  using T = std::conditional_t<kF16, __half, __nv_bfloat16>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t pad = ((raw_addr + 1023u) & ~1023u) - raw_addr;
  unsigned char* smem = smem_raw + pad;
  const uint32_t sbase = raw_addr + pad;  // shared-space address of smem
  int* sSlot = reinterpret_cast<int*>(smem + kOffSlot);
  int* sHi = reinterpret_cast<int*>(smem + kOffHi);

  // Longest first: the linear block index runs over the row tiles from the
  // last one down, (sequence, KV head) fastest.
  int seq, kvh, tile;
  prefill_block_longest_first(a, tiles_per_seq, static_cast<int>(blockIdx.x), seq, kvh, tile);
  const PrefillRows rows = prefill_rows(a, seq, tile, kM);
  const auto [group, q_begin, total_rows, row0] = rows;
  if (row0 >= total_rows) return;  // uniform over the block
  const int kv_len = a.kv_lens[seq];
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int wg = warp >> 2;    // warpgroup: rows 64 wg ..
  const int g = lane >> 2;     // accumulator row within an 8-row half
  const int t4 = lane & 3;     // accumulator column pair
  const int wrow = 16 * warp;  // first row of this warp within the block

  // q -> sQ (zeros past the sequence's rows); completes with K_0's group.
  const T* q = static_cast<const T*>(a.q);
  for (int i = tid; i < kM * kChunks; i += kThreads) {
    const int r = i / kChunks;
    const int c = i - r * kChunks;
    const T* src = prefill_q_chunk<T, kHd>(a, rows, kvh, r, c);
    cp_async16(smem + kOffQ + swz(kM, r, c), src != nullptr ? src : q, src != nullptr ? 16 : 0);
  }

  // Key bound of this thread's two rows (wrow + g, wrow + g + 8): 0 for
  // rows past the sequence; the block's largest bound gives its tiles.
  int hi[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int grow = row0 + wrow + g + 8 * h;
    hi[h] = 0;
    if (grow < total_rows) hi[h] = max(0, min(a.positions[q_begin + grow / group] + 1, kv_len));
  }
  int whi = max(hi[0], hi[1]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, o));
  if (lane == 0) sHi[warp] = whi;
  const int hi_min = min(hi[0], hi[1]);

  const int32_t* pages = a.block_indices + a.block_indptr[seq];
  const T* kc = static_cast<const T*>(a.k_cache);
  const T* vc = static_cast<const T*>(a.v_cache);
  const int bs = a.block_size;
  const bool bs_pow2 = (bs & (bs - 1)) == 0;
  const int bs_shift = __ffs(bs) - 1;
  __syncthreads();  // sHi
  int tile_hi = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) tile_hi = max(tile_hi, sHi[w]);
  const int nt = (tile_hi + kN - 1) / kN;  // key tiles of this block

  // Row of key kp in the [slots x hk] rows of hd elements of the K and V
  // pages (-1 from tile_hi on): the page table, from global memory.
  // (launch_prefill_attention_wgmma checks that the rows fit an int.)
  auto slot_of = [&](int kp) {
    if (kp >= tile_hi) return -1;
    const int page = bs_pow2 ? kp >> bs_shift : kp / bs;
    return (pages[page] * bs + (kp - page * bs)) * a.hk + kvh;
  };
  // This thread's copies of a K or V tile: chunk tid % 16 of keys
  // tid / 16 + 16 n (so the swizzle term (c ^ key) % 8 is fixed per thread).
  const int cp_c = tid & (kChunks - 1);
  const int cp_j = tid / kChunks;
  const uint32_t cp_dst = swz(kN, cp_j, cp_c);
  auto load_tile = [&](uint32_t dst_off, int slot_ring, const T* cache) {
    const int* slots = sSlot + slot_ring * kN;
#pragma unroll
    for (int n = 0; n < kCopies; ++n) {
      const int j = cp_j + n * (kThreads / kChunks);
      const int row = slots[j];
      const T* src = row >= 0 ? cache + static_cast<int64_t>(row) * kHd + cp_c * 8 : cache;
      cp_async16(smem + dst_off + cp_dst + n * (kThreads / kChunks) * 128, src, row >= 0 ? 16 : 0);
    }
  };

  if (nt > 0) {  // block-uniform
    if (tid < kN) {
      sSlot[tid] = slot_of(tid);
      sSlot[kN + tid] = slot_of(kN + tid);
    }
    __syncthreads();
    load_tile(kOffK, 0, kc);
  }
  cp_async_commit();  // Q (+ K_0)

  float o[64];
  float s[64];
  uint32_t pa[8][4];
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    o[i] = 0.0f;
    s[i] = 0.0f;
  }
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0u;
  float m[2] = {-INFINITY, -INFINITY};  // running max (log2 domain, scaled)
  float l[2] = {0.0f, 0.0f};            // this thread's share of the row sums
  constexpr float kLog2e = 1.4426950408889634f;
  const float scale2 = a.scale * kLog2e;
  const uint32_t q_addr = sbase + kOffQ + static_cast<uint32_t>(wg) * 64u * 128u;
  auto pin_all = [&] {
    pin_array(o);
    pin_array(s);
    pin_p(pa);
  };

  // One key tile; kFirst (t == 0): no P V to issue yet. (Peeled rather than
  // branched on t: ptxas serialises every wgmma when the issue of P V is
  // conditional.)
  auto step = [&](const int t, auto first) {
    constexpr bool kFirst = decltype(first)::value;
    const int kb = t * kN;
    // K_t and V_{t-1} (and Q) landed for all threads; every warpgroup is
    // done with K_{t-1} and V_{t-2}, whose ring slots the copies below
    // overwrite, and sSlot[(t + 1) % 3] (stored an iteration ago) is visible.
    cp_async_wait<0>();
    wgmma::fence_proxy_async_shared();
    __syncthreads();

    // S = Q K_t^T, then O += P_{t-1} V_{t-1}, both in flight while this
    // thread issues the copies of K_{t+1} and V_t below (kPvLate: P V after
    // the copies, by when the other warpgroup has usually issued its S too).
    pin_all();
    wgmma::fence();
    issue_s<kF16>(s, q_addr, sbase + kOffK + static_cast<uint32_t>(t & 1) * kKvTile);
    if constexpr (!kFirst && !kPvLate) {
      issue_pv<kF16>(o, pa, sbase + kOffV + static_cast<uint32_t>((t - 1) & 1) * kKvTile);
    }
    if (t + 1 < nt) load_tile(kOffK + static_cast<uint32_t>((t + 1) & 1) * kKvTile, (t + 1) % 3, kc);
    load_tile(kOffV + static_cast<uint32_t>(t & 1) * kKvTile, t % 3, vc);
    cp_async_commit();
    if constexpr (!kFirst && kPvLate) {
      issue_pv<kF16>(o, pa, sbase + kOffV + static_cast<uint32_t>((t - 1) & 1) * kKvTile);
    }
    // Page-table entries of tile t + 2, stored into the ring slot of tile
    // t - 1 (last read in iteration t - 1) after this tile's softmax.
    int next_slot = -1;
    if (tid < kN && t + 2 < nt) next_slot = slot_of(kb + 2 * kN + tid);
    if constexpr (kFirst) {
      wgmma::wait<0>();
    } else {
      wgmma::wait<1>();
    }
    pin_array(s);
    float alpha[2];
    softmax_tile(s, m, l, alpha, kb, hi, hi_min, scale2, t4);
    // Wait for P_{t-1} V_{t-1} (O and the P registers free), then rescale
    // O (alpha == 1 for rows whose max did not grow). The wait sits in both
    // arms of a block-uniform branch (wgmma.wait_group must be executed
    // alike by the whole warpgroup) so that ptxas cannot schedule it above
    // the softmax (it hoists the wait within its basic block otherwise,
    // which serialises the softmax after P V); the rescale stays in the
    // wait's basic block (after a join, or behind a branch of its own,
    // ptxas serialises every wgmma).
    if (t + 2 < nt) {
      wgmma::wait<0>();
      pin_all();
      rescale_o(o, alpha);
      if (tid < kN) sSlot[((t + 2) % 3) * kN + tid] = next_slot;
    } else {
      wgmma::wait<0>();
      pin_all();
      rescale_o(o, alpha);
    }
    pack_p<kF16>(pa, s);
  };
  if (nt > 0) step(0, std::true_type{});
  for (int t = 1; t < nt; ++t) step(t, std::false_type{});

  if (nt > 0) {
    // V_{nt-1} landed for all threads.
    cp_async_wait<0>();
    wgmma::fence_proxy_async_shared();
    __syncthreads();
    pin_all();
    wgmma::fence();
    issue_pv<kF16>(o, pa, sbase + kOffV + static_cast<uint32_t>((nt - 1) & 1) * kKvTile);
    wgmma::wait<0>();
    pin_all();
  } else {
    cp_async_wait<0>();  // the Q copies, before the staging below overwrites sQ
    __syncthreads();
  }
  store_rows<kF16>(a, o, l, smem + kOffQ, wrow, lane, rows, kvh);
#else
  (void)a;
  (void)tiles_per_seq;
  __trap();  // not built for sm_90a: launch_prefill_attention_wgmma never launches this
#endif
}

// Warp-specialised variant: warpgroup 0 gathers K and V tiles with cp.async
// into a ring of six tile slots (item 2 t = K_t, item 2 t + 1 = V_t, slot
// i % 6) and signals each item on its "full" mbarrier once the copies have
// landed (cp.async.mbarrier.arrive: the copying threads never wait for
// their copies); warpgroups 1 and 2 compute (64 rows each, the same step as
// prefill_wgmma_kernel) and hand each item back on its "empty" mbarrier as
// soon as their wgmma have read it: K_t after S_t, V_{t-1} after
// P_{t-1} V_{t-1}. A step holds two items (V_{t-1}, K_t), so the copies run
// up to four items (two tiles) ahead. No block-wide barrier in the key loop:
// the computing warpgroups drift apart and one's softmax overlaps the
// other's wgmma; setmaxnreg moves registers from the copying warpgroup to
// the computing ones.
constexpr int kWsThreads = 384;
constexpr int kWsSlots = 6;          // K or V tiles in the ring
constexpr int kWsCopyRegs = 56;      // per thread, copying warpgroup
constexpr int kWsComputeRegs = 224;  // per thread, computing warpgroups
// setmaxnreg moves registers within the block's allocation at launch (168
// a thread: 65536 / 384 rounded down to a multiple of 8); asking for more
// blocks the raising warpgroups for ever.
static_assert(kWsCopyRegs * 128 + kWsComputeRegs * 256 <= kWsThreads * 168, "register pool of the block");
constexpr uint32_t kWsOffSlot = kOffQ + 2 * kQPanel;             // slot s: one K or V tile
constexpr uint32_t kWsOffBar = kWsOffSlot + kWsSlots * kKvTile;  // uint64_t full[6], empty[6]
constexpr uint32_t kWsOffHi = kWsOffBar + 2 * kWsSlots * 8;      // int [12]: per-warp largest key bound
constexpr uint32_t kWsSmemBytes = kWsOffHi + (kWsThreads / 32) * 4 + 1024;
static_assert(kWsOffSlot % 1024 == 0 && kKvTile % 1024 == 0, "swizzle atoms on 1024-byte boundaries");
static_assert(kWsSmemBytes <= 227 * 1024, "shared memory per block");

// kPingpong: the two computing warpgroups take turns to issue their wgmma
// (named barriers 1 and 2), so that one's softmax runs while the other's
// matrix products do.
template <bool kF16, bool kPingpong>
__global__ void __launch_bounds__(kWsThreads, 1) prefill_wgmma_ws_kernel(PagedAttentionArgs a, int tiles_per_seq) {
#if OSP_WGMMA_DEVICE
  using T = std::conditional_t<kF16, __half, __nv_bfloat16>;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t pad = ((raw_addr + 1023u) & ~1023u) - raw_addr;
  unsigned char* smem = smem_raw + pad;
  const uint32_t sbase = raw_addr + pad;
  int* sHi = reinterpret_cast<int*>(smem + kWsOffHi);
  const uint32_t full_bar = sbase + kWsOffBar;                  // + 8 s: slot s filled
  const uint32_t empty_bar = sbase + kWsOffBar + kWsSlots * 8;  // + 8 s: slot s read

  int seq, kvh, tile;
  prefill_block_longest_first(a, tiles_per_seq, static_cast<int>(blockIdx.x), seq, kvh, tile);
  const PrefillRows rows = prefill_rows(a, seq, tile, kM);
  const auto [group, q_begin, total_rows, row0] = rows;
  if (row0 >= total_rows) return;  // uniform over the block
  const int kv_len = a.kv_lens[seq];
  const int tid = static_cast<int>(threadIdx.x);
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int wg = warp >> 2;  // 0: copies; 1, 2: rows 64 (wg - 1) ..
  const int g = lane >> 2;
  const int t4 = lane & 3;
  const int wrow = 16 * (warp - 4);  // first block row of a computing warp

  // q -> sQ by all threads (zeros past the sequence's rows).
  const T* q = static_cast<const T*>(a.q);
  for (int i = tid; i < kM * kChunks; i += kWsThreads) {
    const int r = i / kChunks;
    const int c = i - r * kChunks;
    const T* src = prefill_q_chunk<T, kHd>(a, rows, kvh, r, c);
    cp_async16(smem + kOffQ + swz(kM, r, c), src != nullptr ? src : q, src != nullptr ? 16 : 0);
  }
  cp_async_commit();

  int hi[2] = {0, 0};  // key bounds of a computing thread's rows wrow + g (+ 8)
  if (wg > 0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int grow = row0 + wrow + g + 8 * h;
      if (grow < total_rows) hi[h] = max(0, min(a.positions[q_begin + grow / group] + 1, kv_len));
    }
  }
  int whi = max(hi[0], hi[1]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, o));
  if (lane == 0) sHi[warp] = whi;
  if (tid == 0) {
    for (int st = 0; st < kWsSlots; ++st) {
      wgmma::mbar_init(full_bar + 8 * st, 128);  // one arrival per copying thread
      wgmma::mbar_init(empty_bar + 8 * st, 8);   // one arrival per computing warp
    }
    wgmma::fence_mbar_init();
  }
  cp_async_wait<0>();
  wgmma::fence_proxy_async_shared();
  __syncthreads();  // sQ, sHi, barriers
  int tile_hi = 0;
#pragma unroll
  for (int w = 0; w < kWsThreads / 32; ++w) tile_hi = max(tile_hi, sHi[w]);
  const int nt = (tile_hi + kN - 1) / kN;

  // Item i (0 .. 2 nt - 1) lives in slot i % kWsSlots; its n-th use of that
  // slot (n = i / kWsSlots) completes phase n of full (filled) and then of
  // empty (read). Every phase of a slot's barriers completes in item order
  // (an item is filled only after the slot's previous item was read, and
  // read only after it was filled), so a barrier is never two phases ahead
  // of its waiter and the parity n & 1 names the phase.
  if (wg == 0) {
    // Copying warpgroup: thread p copies chunk p % 16 of keys p / 16 + 8 n
    // (n = 0..15) of K_t and then of V_t (the same rows), then has the
    // hardware arrive on item i's full barrier once they have landed
    // (.noinc: that arrival is one of the 128 the barrier expects). The
    // computing threads order those writes before their wgmma reads with
    // fence.proxy.async after the wait.
    wgmma::regs_dec<kWsCopyRegs>();
    const int32_t* pages = a.block_indices + a.block_indptr[seq];
    const T* kc = static_cast<const T*>(a.k_cache);
    const T* vc = static_cast<const T*>(a.v_cache);
    const int bs = a.block_size;
    const bool bs_pow2 = (bs & (bs - 1)) == 0;
    const int bs_shift = __ffs(bs) - 1;
    const int c = tid & 15;
    const int j0 = tid >> 4;  // 0..7: (key % 8) is j0 for every key of this thread
    const uint32_t dst0 = swz(kN, j0, c);
    const int items = 2 * nt;
    int rows[kN / 8];  // K/V row (slot * hk + kv head) of this thread's keys of the tile, -1 past tile_hi
    for (int i = 0; i < items; ++i) {
      const int st = i % kWsSlots;
      if (i >= kWsSlots) wgmma::mbar_wait(empty_bar + 8 * st, static_cast<uint32_t>((i / kWsSlots) - 1) & 1u);
      if ((i & 1) == 0) {
        const int kb = (i >> 1) * kN;
#pragma unroll
        for (int n = 0; n < kN / 8; ++n) {
          const int kp = kb + j0 + 8 * n;
          rows[n] = -1;
          if (kp < tile_hi) {
            const int page = bs_pow2 ? kp >> bs_shift : kp / bs;
            rows[n] = (pages[page] * bs + (kp - page * bs)) * a.hk + kvh;
          }
        }
      }
      const T* cache = (i & 1) ? vc : kc;
      unsigned char* dst = smem + kWsOffSlot + st * kKvTile + dst0;
#pragma unroll
      for (int n = 0; n < kN / 8; ++n) {
        const int64_t off = rows[n] >= 0 ? static_cast<int64_t>(rows[n]) * kHd + c * 8 : 0;
        cp_async16(dst + n * 8 * 128, cache + off, rows[n] >= 0 ? 16 : 0);
      }
      wgmma::cp_async_mbar_arrive_noinc(full_bar + 8 * st);
    }
    cp_async_commit();  // no copy of this thread outlives it
    cp_async_wait<0>();
  } else {
    wgmma::regs_inc<kWsComputeRegs>();
    const int hi_min = min(hi[0], hi[1]);
    float o[64];
    float s[64];
    uint32_t pa[8][4];
#pragma unroll
    for (int i = 0; i < 64; ++i) {
      o[i] = 0.0f;
      s[i] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0u;
    float m[2] = {-INFINITY, -INFINITY};
    float l[2] = {0.0f, 0.0f};
    constexpr float kLog2e = 1.4426950408889634f;
    const float scale2 = a.scale * kLog2e;
    const uint32_t q_addr = sbase + kOffQ + static_cast<uint32_t>(wg - 1) * 64u * 128u;
    auto pin_all = [&] {
      pin_array(o);
      pin_array(s);
      pin_p(pa);
    };
    // Turns (kPingpong): warpgroup cw waits on barrier 1 + cw before issuing
    // and then releases the other's; warpgroup 1 opens warpgroup 0's first
    // turn and skips its own last release, so every barrier sees as many
    // arrivals as waits.
    const int cw = wg - 1;
    auto my_turn = [&] {
      if constexpr (kPingpong) asm volatile("bar.sync %0, 256;\n" ::"r"(1 + cw) : "memory");
    };
    auto your_turn = [&] {
      if constexpr (kPingpong) asm volatile("bar.arrive %0, 256;\n" ::"r"(2 - cw) : "memory");
    };
    if (nt > 0 && cw == 1) your_turn();
    auto item_addr = [&](int i) { return sbase + kWsOffSlot + static_cast<uint32_t>(i % kWsSlots) * kKvTile; };
    // Waits for item i filled (the caller then orders the copies before its
    // wgmma reads: fence.proxy.async).
    auto wait_full = [&](int i) {
      wgmma::mbar_wait(full_bar + 8 * (i % kWsSlots), static_cast<uint32_t>(i / kWsSlots) & 1u);
    };
    // Hands item i back (its wgmma have completed: after the wait_group).
    auto release = [&](int i) {
      if (lane == 0) wgmma::mbar_arrive(empty_bar + 8 * (i % kWsSlots));
    };
    // One key tile, as in prefill_wgmma_kernel's step, with the item ring
    // in place of the block barrier.
    auto step = [&](const int t, auto first) {
      constexpr bool kFirst = decltype(first)::value;
      wait_full(2 * t);
      if constexpr (!kFirst) wait_full(2 * t - 1);
      wgmma::fence_proxy_async_shared();
      pin_all();
      my_turn();
      wgmma::fence();
      issue_s<kF16>(s, q_addr, item_addr(2 * t));
      if constexpr (kFirst) {
        your_turn();
        wgmma::wait<0>();
      } else {
        issue_pv<kF16>(o, pa, item_addr(2 * t - 1));
        your_turn();
        wgmma::wait<1>();
      }
      pin_array(s);
      release(2 * t);  // K_t read
      float alpha[2];
      softmax_tile(s, m, l, alpha, t * kN, hi, hi_min, scale2, t4);
      // The wait for P_{t-1} V_{t-1} in both arms of a block-uniform branch
      // (see prefill_wgmma_kernel); V_{t-1} is handed back where the copying
      // warpgroup still needs its slot (item 2 t - 1 + kWsSlots < 2 nt).
      if (!kFirst && t + 2 < nt) {
        wgmma::wait<0>();
        pin_all();
        rescale_o(o, alpha);
        release(2 * t - 1);
      } else {
        wgmma::wait<0>();
        pin_all();
        rescale_o(o, alpha);
      }
      pack_p<kF16>(pa, s);
    };
    if (nt > 0) step(0, std::true_type{});
    for (int t = 1; t < nt; ++t) step(t, std::false_type{});
    if (nt > 0) {
      wait_full(2 * nt - 1);
      wgmma::fence_proxy_async_shared();
      pin_all();
      my_turn();
      wgmma::fence();
      issue_pv<kF16>(o, pa, item_addr(2 * nt - 1));
      if (cw == 0) your_turn();
      wgmma::wait<0>();
      pin_all();
    }
    store_rows<kF16>(a, o, l, smem + kOffQ, wrow, lane, rows, kvh);
  }
#else
  (void)a;
  (void)tiles_per_seq;
  __trap();  // not built for sm_90a: launch_prefill_attention_wgmma never launches this
#endif
}

}  // namespace

bool prefill_wgmma_available() {
#if defined(OSPREY_CUDA_SM90A)
  return device_sm(current_device()) == 90;  // asked on every prefill launch: cached per device
#else
  return false;
#endif
}

bool prefill_wgmma_supports(const PagedAttentionArgs& a) {
  // K/V rows (slot x KV head) are indexed with an int.
  return prefill_attention_supported(a) && a.hd == kHd && a.window == 0 && a.scale > 0.0f && aligned16(a.out) &&
         int64_t{a.num_blocks} * a.block_size * a.hk < int64_t{INT_MAX};
}

void launch_prefill_attention_wgmma(const PagedAttentionArgs& a, cudaStream_t stream, int variant) {
  OSP_CHECK(prefill_wgmma_supports(a));
  OSP_CHECK(prefill_wgmma_available());
  OSP_CHECK(variant >= 0 && variant < kNumPrefillWgmmaVariants);
  if (a.num_tokens == 0 || a.num_seqs == 0 || a.max_q_len == 0) return;
  if (variant == 0) variant = kPrefillWgmmaDefaultVariant;
  const int group = a.hq / a.hk;
  const int64_t tiles = (int64_t{a.max_q_len} * group + kM - 1) / kM;
  const int64_t blocks = static_cast<int64_t>(a.num_seqs) * tiles * a.hk;
  OSP_CHECK_LE(blocks, int64_t{2147483647});
  const bool f16 = a.act == DType::kF16;
  auto kernel = f16 ? prefill_wgmma_kernel<true, false> : prefill_wgmma_kernel<false, false>;
  if (variant == 4) kernel = f16 ? prefill_wgmma_kernel<true, true> : prefill_wgmma_kernel<false, true>;
  if (variant == 2) kernel = f16 ? prefill_wgmma_ws_kernel<true, false> : prefill_wgmma_ws_kernel<false, false>;
  if (variant == 3) kernel = f16 ? prefill_wgmma_ws_kernel<true, true> : prefill_wgmma_ws_kernel<false, true>;
  const bool ws = variant == 2 || variant == 3;
  const int threads = ws ? kWsThreads : kThreads;
  const uint32_t smem = ws ? kWsSmemBytes : kSmemBytes;
  set_max_dynamic_smem_once(kernel, smem);
  kernel<<<static_cast<unsigned>(blocks), threads, smem, stream>>>(a, static_cast<int>(tiles));
  OSP_CUDA_CHECK_LAUNCH();
}

}  // namespace osprey::cuda
