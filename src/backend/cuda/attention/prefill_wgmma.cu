// Paged prefill attention on Hopper warpgroup MMA (wgmma, sm_90a): 16-bit q,
// out and pages of one type T (BF16 or F16), or F8_E4M3 pages (variants 2
// and 3: widened to T in shared memory; or I8, with their row scales),
// head_dim 128 (every variant) or 64, sliding windows (64, one-byte pages
// and windows: the warp-specialised variants 2 and 3 only); the same
// function as prefill_attention_mma.cu (FlashAttention-2
// arithmetic: fp32 scores and accumulators, online softmax in exp2 with the
// scale folded in, P rounded to T for P V).
//
// Work tile: kM = 128 rows of one sequence and one KV head, row r = (query
// token r / G, query head kv_head * G + r % G), G = hq / hk, so the G query
// heads of a KV head share every K/V tile. Two warpgroups of 4 warps, each
// owning 64 rows: S[64 x 128 keys] = Q K^T as wgmma m64n128k16 with Q from
// registers (each warp's 16 rows, loaded once from the Q tile: no Q
// descriptors in the key loop) and K from shared memory (d / 16 k-steps),
// O[64 x d] += P V (m64n128k16, or
// m64n64k16 at head_dim 64) with P straight
// from the S accumulators in registers (rounded to T in place: the
// accumulator layout of S is the A-fragment layout of P) and V from shared
// memory through the transposed-B descriptor. S, O and the softmax state
// stay in registers for the whole key loop.
//
// Pipeline per key tile t (kN = 128 keys), all 256 threads copying:
//   top:    cp.async of K_t and V_{t-1} landed, fence.proxy.async, barrier
//   issue:  S_t = Q K_t^T, then O += P_{t-1} V_{t-1} (both asynchronous;
//           kPvLate, variant 4: P V only after the copies)
//   copies: K_{t+1} and V_t gathered through the page table with 16-byte
//           cp.async (zeros past the block's key range) into two-deep
//           K and V rings, while the tensor cores work; page-table
//           entries of tile t+2 fetched meanwhile
//   wait S: mask (only tiles straddling a row's end), row max, exp2, sums
//           (runs while the tensor cores still do P_{t-1} V_{t-1})
//   wait PV: rescale O, P_t = round(S_t)
// and P_{last} V_{last} after the loop. Shared-memory tiles use the 128-byte
// swizzle of the wgmma descriptors: 64-element column panels (two at
// head_dim 128, one at 64) of 128-byte rows, the 16-byte chunk c of row r stored at chunk c ^ (r % 8), tiles on
// 1024-byte boundaries (prefill_wgmma.cuh).
//
// Row r sees keys [0, min(pos + 1, kv_len)), pos = positions[token]:
// causal by position, so earlier pages (prefix cache, earlier chunks) and
// variable lengths need nothing else; rows without keys get 0. Under a
// sliding window (variants 2 and 3) row r's keys start at
// max(0, pos - window + 1): the block's key tiles start at the tile of its
// rows' smallest first key, and tiles that start before a row's first key
// are masked for it as tiles past its end are. Blocks are
// issued longest-first (the last row tile of every sequence and KV head
// before any shorter one), as in the mma.sync kernel.
//
// Code layout: both kernels (prefill_wgmma_kernel, variants 1 and 4, and
// the warp-specialised prefill_wgmma_ws_kernel, variants 2 and 3) take
// their prologue (wg_block: block -> tile and thread coordinates; load_q;
// key_bounds / block_key_bound; KvPages: the page table) and the
// arithmetic of their computing warpgroups (WgRows: S issue, mask and
// online softmax, O rescale, P rounding, P V issue, final normalisation
// and store) from the helpers below. What each kernel writes out itself is
// where those inlined pieces go relative to its copies, barriers and
// waits: that placement is what the variants differ in.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "backend/cuda/attention/kv_fp8.cuh"
#include "backend/cuda/attention/mma_ptx.cuh"
#include "backend/cuda/attention/prefill_rows.cuh"
#include "backend/cuda/attention/prefill_wgmma.cuh"
#include "backend/cuda/attention/prefill_wgmma.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/device_query.h"
#include "backend/cuda/host_util.h"

namespace osprey::cuda {
namespace {

constexpr int kM = 128;        // rows per block (2 warpgroups x 64)
constexpr int kN = 128;        // keys per tile
constexpr int kThreads = 256;  // 8 warps (prefill_wgmma_kernel)
static_assert(kN <= kThreads, "one page-table entry per thread");

// Shared memory, byte offsets from a 1024-aligned base. Q, K and V tiles
// are [panels][rows][128 bytes] (swizzled), a panel per 64 elements of
// head_dim.
constexpr uint32_t kQPanel = kM * 128;   // bytes of one Q panel
constexpr uint32_t kKvPanel = kN * 128;  // bytes of one K or V panel
constexpr uint32_t kOffQ = 0;

// Tile shapes of head_dim kHd (64: one panel, 128: two).
template <int kHd>
struct HdTiles {
  static_assert(kHd == 64 || kHd == 128, "head_dim 64 or 128");
  static constexpr int kPanels = kHd / 64;
  static constexpr int kChunks = kHd / 8;  // 16-byte chunks of a 16-bit row
  static constexpr uint32_t kQTile = kPanels * kQPanel;
  static constexpr uint32_t kKvTile = kPanels * kKvPanel;
};

static_assert(HdTiles<64>::kChunks == 8 && HdTiles<128>::kChunks == 16, "16-byte chunks of a row");

// prefill_wgmma_kernel (variants 1 and 4) takes head_dim 128 only.
using Hd128 = HdTiles<128>;
constexpr int kCopies = kN * Hd128::kChunks / kThreads;  // 16-byte copies per thread per K or V tile
static_assert(kCopies * kThreads == kN * Hd128::kChunks && kM * Hd128::kChunks % kThreads == 0, "tile copies");
constexpr uint32_t kOffK = kOffQ + Hd128::kQTile;        // K ring [2]
constexpr uint32_t kOffV = kOffK + 2 * Hd128::kKvTile;  // V ring [2]
constexpr uint32_t kOffSlot =
    kOffV + 2 * Hd128::kKvTile;  // int [3][kN]: K/V row per key (slot * hk + kv head), -1 past the range
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

// ---- Prologue of both kernels ----

// A block's work tile and this thread's place in it.
struct WgBlock {
  unsigned char* smem;  // dynamic shared memory from its first 1024-byte boundary
  uint32_t sbase;       // shared-space address of smem
  PrefillRows rows;     // the kM rows of the tile
  int seq, kvh;
  int kv_len;  // keys of the sequence
  int tid, warp, lane;
  int g;   // accumulator row within an 8-row half
  int t4;  // accumulator column pair
};

// Fills b for this block. Longest first: the linear block index runs over
// the row tiles from the last one down, (sequence, KV head) fastest. False
// when the tile holds no rows (uniform over the block: it returns at once).
__device__ __forceinline__ bool wg_block(const PagedAttentionArgs& a, int tiles_per_seq, unsigned char* smem_raw,
                                         WgBlock& b) {
  const uint32_t raw_addr = smem_addr(smem_raw);
  const uint32_t pad = ((raw_addr + 1023u) & ~1023u) - raw_addr;
  b.smem = smem_raw + pad;
  b.sbase = raw_addr + pad;
  int tile;
  prefill_block_longest_first(a, tiles_per_seq, static_cast<int>(blockIdx.x), b.seq, b.kvh, tile);
  b.rows = prefill_rows(a, b.seq, tile, kM);
  if (b.rows.row0 >= b.rows.total_rows) return false;
  b.kv_len = a.kv_lens[b.seq];
  b.tid = static_cast<int>(threadIdx.x);
  b.warp = b.tid >> 5;
  b.lane = b.tid & 31;
  b.g = b.lane >> 2;
  b.t4 = b.lane & 3;
  return true;
}

// Block rows r, r + kStep, r + 2 kStep, .. of a thread, walked with their
// tokens and heads stepped (prefill_row_offset's arithmetic with one
// division a thread, not one a row).
template <int kHd, int kStep>
struct RowWalk {
  const PagedAttentionArgs& a;
  const WgBlock& b;
  int grow;  // the sequence's row: token tq, head hh of the group
  int tq, hh;
  int dq, dh;  // kStep rows: dq tokens and dh heads on

  __device__ __forceinline__ RowWalk(const PagedAttentionArgs& args, const WgBlock& blk, int r) : a(args), b(blk) {
    const int group = b.rows.group;
    grow = b.rows.row0 + r;
    tq = grow / group;
    hh = grow - tq * group;
    dq = kStep / group;
    dh = kStep - dq * group;
  }
  // Element offset of the current row in a [num_tokens, hq, kHd] tensor;
  // -1 past the sequence.
  __device__ __forceinline__ int64_t offset() const {
    return grow < b.rows.total_rows ? prefill_head_offset<kHd>(a, b.rows, b.kvh, tq, hh) : -1;
  }
  __device__ __forceinline__ void next() {
    grow += kStep;
    tq += dq;
    hh += dh;
    if (hh >= b.rows.group) {
      hh -= b.rows.group;
      ++tq;
    }
  }
};

// q -> the Q tile at smem + kOffQ (zeros past the sequence's rows) by the
// kBlockThreads threads of the block: cp.async, not committed. Thread t
// copies chunk t % kChunks of rows t / kChunks + (kBlockThreads / kChunks) n
// (RowWalk: no division a row).
template <class T, int kHd, int kBlockThreads>
__device__ __forceinline__ void load_q(const PagedAttentionArgs& a, const WgBlock& b) {
  constexpr int kChunks = HdTiles<kHd>::kChunks;
  constexpr int kStep = kBlockThreads / kChunks;
  static_assert(kBlockThreads % kChunks == 0, "a thread keeps its chunk column");
  const T* q = static_cast<const T*>(a.q);
  const int c = b.tid % kChunks;
  const int r0 = b.tid / kChunks;
  RowWalk<kHd, kStep> w(a, b, r0);
#pragma unroll
  for (int n = 0; n < (kM + kStep - 1) / kStep; ++n) {
    const int r = r0 + kStep * n;
    if (r < kM) {
      const int64_t off = w.offset();
      cp_async16(b.smem + kOffQ + swz(kM, r, c), off >= 0 ? q + off + c * 8 : q, off >= 0 ? 16 : 0);
    }
    w.next();
  }
}

// Key bound of block row r: row r sees keys [0, min(pos + 1, kv_len));
// 0 for a row past the sequence.
__device__ __forceinline__ int row_key_bound(const PagedAttentionArgs& a, const WgBlock& b, int r) {
  const int grow = b.rows.row0 + r;
  if (grow >= b.rows.total_rows) return 0;
  return max(0, min(a.positions[b.rows.q_begin + grow / b.rows.group] + 1, b.kv_len));
}

// First key of block row r under a sliding window (a.window > 0): row r
// sees keys from max(0, pos - window + 1); 0 without a window; INT_MAX for
// a row past the sequence (it sees none, and must not lower the block's
// first key tile).
__device__ __forceinline__ int row_key_lo(const PagedAttentionArgs& a, const WgBlock& b, int r) {
  const int grow = b.rows.row0 + r;
  if (grow >= b.rows.total_rows) return INT_MAX;
  if (a.window <= 0) return 0;
  return max(0, a.positions[b.rows.q_begin + grow / b.rows.group] - a.window + 1);
}

// Key bounds hi of this thread's block rows wrow + g and wrow + g + 8
// (row_key_bound): 0 for threads without rows (!has_rows: the copying
// warps). The warp's largest goes to warp_hi[warp]; after a barrier,
// block_key_bound gives the block's largest, hence its key tiles. With
// warp_lo (the warp-specialised kernel, which takes sliding windows): lo,
// the rows' first keys (row_key_lo; INT_MAX without rows), and the warp's
// smallest in warp_lo[warp] (block_key_lo).
__device__ __forceinline__ void key_bounds(const PagedAttentionArgs& a, const WgBlock& b, int wrow, bool has_rows,
                                           int (&hi)[2], int* warp_hi, int (&lo)[2], int* warp_lo) {
  hi[0] = has_rows ? row_key_bound(a, b, wrow + b.g) : 0;
  hi[1] = has_rows ? row_key_bound(a, b, wrow + b.g + 8) : 0;
  int whi = max(hi[0], hi[1]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, o));
  if (b.lane == 0) warp_hi[b.warp] = whi;
  lo[0] = lo[1] = 0;
  if (warp_lo == nullptr) return;
  lo[0] = has_rows ? row_key_lo(a, b, wrow + b.g) : INT_MAX;
  lo[1] = has_rows ? row_key_lo(a, b, wrow + b.g + 8) : INT_MAX;
  int wlo = min(lo[0], lo[1]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, o));
  if (b.lane == 0) warp_lo[b.warp] = wlo;
}
template <int kWarps>
__device__ __forceinline__ int block_key_bound(const int* warp_hi) {
  int tile_hi = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) tile_hi = max(tile_hi, warp_hi[w]);
  return tile_hi;
}
template <int kWarps>
__device__ __forceinline__ int block_key_lo(const int* warp_lo) {
  int key_lo = INT_MAX;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) key_lo = min(key_lo, warp_lo[w]);
  return key_lo;
}

// The K and V pages of one sequence and KV head, through its page table
// (global memory).
template <class T>
struct KvPages {
  const PagedAttentionArgs& a;  // hk read at each use
  const int32_t* pages;         // the sequence's page table
  const T* k;                   // a.k_cache
  const T* v;                   // a.v_cache
  int bs;                       // block_size
  bool bs_pow2;
  int bs_shift;  // log2(bs) where bs_pow2
  int kvh;

  __device__ __forceinline__ KvPages(const PagedAttentionArgs& args, int seq, int kv_head)
      : a(args),
        pages(args.block_indices + args.block_indptr[seq]),
        k(static_cast<const T*>(args.k_cache)),
        v(static_cast<const T*>(args.v_cache)),
        bs(args.block_size),
        bs_pow2((bs & (bs - 1)) == 0),
        bs_shift(__ffs(bs) - 1),
        kvh(kv_head) {}

  // Row of key kp (< kv_len) in the [slots x hk] rows of hd elements of the
  // K and V pages (launch_prefill_attention_wgmma checks that the rows fit
  // an int). The callers give -1 to keys past the block's range
  // (zero-filled copies).
  __device__ __forceinline__ int row(int kp) const {
    const int page = bs_pow2 ? kp >> bs_shift : kp / bs;
    return row_in(pages[page], page, kp);
  }
  // The row of key kp, in page number `page` of the sequence, whose
  // page-table entry is `entry`.
  __device__ __forceinline__ int row_in(int entry, int page, int kp) const {
    return (entry * bs + (kp - page * bs)) * a.hk + kvh;
  }

  // rows[n] = row(k0 + step n) for n < kKeys, -1 from hi on (hi >= 1). The kKeys
  // page-table entries are loaded together, before any is used, so that
  // the caller waits for the page table once, not once a key. kPow2:
  // bs_pow2 (the caller branches on it once, outside its loop).
  // scales != nullptr (I8 pages): scales[n] = the index of that key's row
  // scale (ops::kv_row_scale_index_at, in 32-bit arithmetic: the rows fit an
  // int), 0 from hi on.
  template <int kKeys, bool kPow2>
  __device__ __forceinline__ void rows_of(int k0, int step, int hi, int* rows, int* scales = nullptr) const {
    int pg[kKeys];
    int entry[kKeys];
#pragma unroll
    for (int n = 0; n < kKeys; ++n) pg[n] = page_of<kPow2>(min(k0 + step * n, hi - 1));
#pragma unroll
    for (int n = 0; n < kKeys; ++n) entry[n] = pages[pg[n]];
#pragma unroll
    for (int n = 0; n < kKeys; ++n) key_row(k0 + step * n, hi, pg[n], entry[n], rows[n], scales ? scales + n : nullptr);
  }
  // rows_of for a caller that has the keys' page-table entries some other
  // way (copy_kv_items_8: copied a tile ahead into shared memory).
  template <int kKeys, bool kPow2>
  __device__ __forceinline__ void rows_from(int k0, int step, int hi, const int* entry, int* rows,
                                            int* scales = nullptr) const {
#pragma unroll
    for (int n = 0; n < kKeys; ++n) {
      const int kp = k0 + step * n;
      key_row(kp, hi, page_of<kPow2>(min(kp, hi - 1)), entry[n], rows[n], scales ? scales + n : nullptr);
    }
  }
  // Key kp's row (-1 from hi on) and, scale != nullptr, its row scale's
  // index (0 from hi on), given its page number pg and that page's entry.
  __device__ __forceinline__ void key_row(int kp, int hi, int pg, int entry, int& row, int* scale) const {
    row = kp < hi ? row_in(entry, pg, kp) : -1;
    if (scale != nullptr) *scale = kp < hi ? ops::kv_row_scale_index_at<int>(entry, kp - pg * bs, kvh, a.hk, bs) : 0;
  }
  template <bool kPow2>
  __device__ __forceinline__ int page_of(int kp) const {
    return kPow2 ? kp >> bs_shift : kp / bs;
  }
};

// Address of chunk c of K/V row `row`, given chunk_base = the cache's first
// byte + 16 c; row < 0 (past the range: the copy zero-fills and reads
// nothing) gives row 0's.
template <class T, int kHd>
__device__ __forceinline__ const void* kv_chunk_src(const char* chunk_base, int row) {
  return chunk_base + static_cast<uint64_t>(static_cast<uint32_t>(max(row, 0))) * (kHd * sizeof(T));
}

// ---- The computing warpgroups of both kernels ----

// How far (log2 domain) a tile's row max may exceed the running max before
// the running max moves (WgRows::softmax).
constexpr float kMaxSlack = 8.0f;

// The 64 rows of one computing warpgroup: S, O, P and the online-softmax
// state, in registers for the whole key loop, and the arithmetic of a key
// tile t as the pieces each kernel interleaves with its copies, barriers
// and turns (the variants differ only in that placement):
//   pin_all(); wgmma::fence(); issue_s(K_t); [t > 0: issue_pv(V_{t-1})];
//   wait_s(); softmax(t kN); wait_rescale() (in both arms of a branch);
//   pack_p();
// and after the last tile pin_all(); wgmma::fence(); issue_pv(V_last);
// wait_pv(); store().
// o, s, pa, m and l are separate arrays of the kernel, bound here by
// reference: as members of one aggregate they leave the registers and
// spills as they are but change the kernels' machine code (instruction
// order); as separate locals the kernels compile to the same code as with
// the arithmetic written out in each.
template <bool kF16, int kHd>
struct WgRows {
  static constexpr int kO = kHd / 2;  // O accumulators per thread
  float (&o)[kO];        // O[64 x kHd], the m64nkHd accumulator layout (wgmma::mma_rs)
  float (&s)[64];        // S_t, then P_t = exp2(S_t scale2 - m) in fp32
  uint32_t (&pa)[8][4];  // P rounded to T, the A operand of P V (k-step kk: keys 16 kk ..)
  float (&m)[2];         // running max of rows g and g + 8 (log2 domain, scaled)
  float (&l)[2];         // this thread's share of their row sums
  float alpha[2];        // the factor O is scaled by after this tile's softmax
  int hi[2];             // key bounds of rows g and g + 8
  int hi_min;            // min(hi[0], hi[1])
  int lo[2];             // first keys of rows g and g + 8 (sliding window; else 0)
  int lo_max;            // max(lo[0], lo[1])
  float scale2;          // scale log2(e)
  uint32_t qa[kHd / 16][4];  // this warp's Q rows, the A operand of S (k-step kk: dims 16 kk ..)

  // Zeroes o, s, pa and l, sets m to -inf. row_hi, row_lo: key bounds
  // and first keys (key_bounds). qa is loaded by load_q once Q has landed.
  __device__ __forceinline__ WgRows(float (&o_)[kO], float (&s_)[64], uint32_t (&pa_)[8][4], float (&m_)[2],
                                    float (&l_)[2], const int (&row_hi)[2], const int (&row_lo)[2], float scale)
      : o(o_), s(s_), pa(pa_), m(m_), l(l_) {
    hi[0] = row_hi[0];
    hi[1] = row_hi[1];
    hi_min = min(row_hi[0], row_hi[1]);
    lo[0] = row_lo[0];
    lo[1] = row_lo[1];
    lo_max = max(row_lo[0], row_lo[1]);
#pragma unroll
    for (int i = 0; i < kO; ++i) o[i] = 0.0f;
#pragma unroll
    for (int i = 0; i < 64; ++i) s[i] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) pa[kk][0] = pa[kk][1] = pa[kk][2] = pa[kk][3] = 0u;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;
    scale2 = scale * 1.4426950408889634f;  // log2(e)
  }

  // This warp's 16 Q rows (block rows wrow ..) from the Q tile at smem_q
  // into qa, once Q has landed there. kSrcF16: the tile's type (F16, else
  // BF16); a BF16 tile under F16 compute (kF16) is rounded to F16,
  // saturating at +-65504 (NaN stays NaN).
  template <bool kSrcF16 = kF16>
  __device__ __forceinline__ void load_q(const unsigned char* smem_q, int wrow, int g, int t4) {
    static_assert(kSrcF16 == kF16 || kF16, "F16 q is not rounded to BF16");
#pragma unroll
    for (int kk = 0; kk < kHd / 16; ++kk) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const uint32_t x = *reinterpret_cast<const uint32_t*>(
            smem_q + swz(kM, wrow + g + 8 * (e & 1), 2 * kk + (e >> 1)) + t4 * 4);
        if constexpr (kSrcF16 == kF16) {
          qa[kk][e] = x;
        } else {
          const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x));
          qa[kk][e] = f32x2_to_half2_bits_satfinite(f.x, f.y);
        }
      }
    }
  }

  __device__ __forceinline__ void pin_all() {
    pin_array(o);
    pin_array(s);
    pin_p(pa);
  }

  // S[64 x 128] = Q K^T with Q from qa and the K tile at k_addr, issued and
  // committed (kHd / 16 k-steps along d). Each k-step's K descriptor is the
  // tile's first plus the step's offset (wgmma::desc_plus: one add, where
  // sw128_desc of each step's address took four instructions). Q as a
  // register operand (session 32) leaves the key loop without the Q
  // descriptors' moves to uniform registers (919 -> 901 instructions).
  __device__ __forceinline__ void issue_s(uint32_t k_addr) {
    const uint64_t dk = wgmma::sw128_desc(k_addr, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < kHd / 16; ++kk) {
      const uint32_t koff = static_cast<uint32_t>(kk & 3) * 32u;  // 16 elements along d within a panel
      wgmma::mma_rs<kF16, kN, false>(s, qa[kk],
                                     wgmma::desc_plus(dk, static_cast<uint32_t>(kk >> 2) * kKvPanel + koff), kk > 0);
    }
    wgmma::commit();
  }

  // O[64 x kHd] += P V with the V tile at v_addr, issued and committed
  // (8 k-steps over the tile's keys).
  __device__ __forceinline__ void issue_pv(uint32_t v_addr) {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
      wgmma::mma_rs<kF16, kHd, true>(o, pa[kk], wgmma::sw128_desc(v_addr + kk * 16 * 128, kKvPanel, 1024), true);
    }
    wgmma::commit();
  }

  // Waits for S_t: first (std::true_type at t == 0) no P V is in flight,
  // else P_{t-1} V_{t-1} may still run.
  template <class First>
  __device__ __forceinline__ void wait_s(First) {
    if constexpr (First::value) {
      wgmma::wait<0>();
    } else {
      wgmma::wait<1>();
    }
    pin_array(s);
  }

  // Waits for every wgmma of this warpgroup (O and the P registers free).
  __device__ __forceinline__ void wait_pv() {
    wgmma::wait<0>();
    pin_all();
  }

  // S_t's keys kb + (0..127) set to -inf for row g (h = 0) or g + 8 (h = 1)
  // where key >= bound[h] (kBelow: key < bound[h]).
  template <bool kBelow>
  __device__ __forceinline__ void mask_keys(int kb, int t4, const int (&bound)[2]) {
#pragma unroll
    for (int j = 0; j < 16; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = kb + j * 8 + t4 * 2 + (e & 1);
        if (kBelow ? col < bound[e >> 1] : col >= bound[e >> 1]) s[4 * j + e] = -INFINITY;
      }
    }
  }

  // S_t (keys kb .. kb + 127 of rows g and g + 8; t4: the accumulator
  // column pair) through the online softmax in the log2 domain: masked
  // where the tile runs past a row's end or (sliding window) starts before
  // its first key, m and l updated, S overwritten with P = exp2(S scale2 -
  // m), alpha set.
  __device__ __forceinline__ void softmax(int kb, int t4) {
    if (kb + kN > hi_min) mask_keys<false>(kb, t4, hi);
    if (kb < lo_max) mask_keys<true>(kb, t4, lo);
    // Four partial maxima and sums per row: shorter dependency chains, each
    // started from s[4 q + 2 h + {0, 1}] (not from -inf and 0: one
    // instruction less a chain).
    float mx[2][4], ps[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int q = 0; q < 4; ++q) mx[h][q] = fmaxf(s[4 * q + 2 * h], s[4 * q + 2 * h + 1]);
    }
#pragma unroll
    for (int i = 16; i < 64; ++i) mx[(i >> 1) & 1][(i >> 2) & 3] = fmaxf(mx[(i >> 1) & 1][(i >> 2) & 3], s[i]);
    float mu[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float x = fmaxf(fmaxf(mx[h][0], mx[h][1]), fmaxf(mx[h][2], mx[h][3]));
      x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
      x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
      // scale2 > 0: max(s) * scale2 = max(s * scale2). The running max
      // moves only when this tile's exceeds it by more than kMaxSlack (P <=
      // 2^kMaxSlack otherwise): most tiles then leave alpha at 1 and O as it
      // is (wait_rescale).
      const float xs = x * scale2;
      const float mn = xs > m[h] + kMaxSlack ? xs : m[h];
      // A row with no key so far keeps max -inf: subtract 0 so p = exp2(-inf) = 0.
      mu[h] = mn == -INFINITY ? 0.0f : mn;
      alpha[h] = fast_exp2(m[h] - mu[h]);
      m[h] = mn;
    }
#pragma unroll
    for (int i = 0; i < 64; ++i) s[i] = fast_exp2(fmaf(s[i], scale2, -mu[(i >> 1) & 1]));
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int q = 0; q < 4; ++q) ps[h][q] = s[4 * q + 2 * h] + s[4 * q + 2 * h + 1];
    }
#pragma unroll
    for (int i = 16; i < 64; ++i) ps[(i >> 1) & 1][(i >> 2) & 3] += s[i];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      l[h] = l[h] * alpha[h] + ((ps[h][0] + ps[h][1]) + (ps[h][2] + ps[h][3]));
      wgmma::pin(l[h]);
    }
    // The softmax above must run before the caller's wait for P V.
    pin_array(s);
  }

  // Waits for P_{t-1} V_{t-1} (O and the P registers free), then rescales
  // O by alpha, skipped (a warp-uniform branch) when every alpha of the
  // warp is 1: no row's running max moved (softmax's kMaxSlack makes that
  // the common case; session 32). The kernels call it in both arms of a
  // warpgroup-uniform branch (wgmma.wait_group must be executed alike by
  // the whole warpgroup) so that ptxas cannot schedule the wait above the
  // softmax (it hoists the wait within its basic block otherwise, which
  // serialises the softmax after P V). The rescale follows the wait in the
  // same function: an earlier version that rescaled after the caller's
  // join had ptxas serialise every wgmma (the SASS of this one keeps one
  // WARPGROUP.ARRIVE a key tile).
  __device__ __forceinline__ void wait_rescale() {
    wait_pv();
    if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
      for (int j = 0; j < kHd / 8; ++j) {
        o[4 * j + 0] *= alpha[0];
        o[4 * j + 1] *= alpha[0];
        o[4 * j + 2] *= alpha[1];
        o[4 * j + 3] *= alpha[1];
      }
    }
  }

  // P_t rounded to T into pa (the S accumulator layout is the A-fragment
  // layout of P).
  __device__ __forceinline__ void pack_p() {
#pragma unroll
    for (int kk = 0; kk < 8; ++kk) {
#pragma unroll
      for (int e = 0; e < 4; ++e) pa[kk][e] = pack2<kF16>(s[8 * kk + 2 * e], s[8 * kk + 2 * e + 1]);
    }
  }

  // out = O / l for the 16 rows of this warp (block rows wrow ..), staged
  // through those rows of the Q tile (no other warp reads them, and every
  // wgmma reading them has completed) for 16-byte stores.
  // kKvF8: times the layer's V scale (one-byte pages: F8_E4M3, or I8,
  // whose layer scales are 1). kOutF16: the output's type (F16, else BF16).
  template <bool kKvF8 = false, bool kOutF16 = kF16>
  __device__ __forceinline__ void store(const PagedAttentionArgs& a, const WgBlock& b, int wrow) const {
    using T = std::conditional_t<kOutF16, __half, __nv_bfloat16>;
    constexpr int kChunks = HdTiles<kHd>::kChunks;
    unsigned char* smem_q = b.smem + kOffQ;
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = l[h];
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      inv[h] = sum > 0.0f ? (kKvF8 ? a.v_scale : 1.0f) / sum : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wrow + b.g + 8 * h;
        *reinterpret_cast<uint32_t*>(smem_q + swz(kM, r, j) + b.t4 * 4) =
            pack2<kOutF16>(o[4 * j + 2 * h] * inv[h], o[4 * j + 2 * h + 1] * inv[h]);
      }
    }
    __syncwarp();
    // Lane l stores chunk l % kChunks of rows wrow + l / kChunks + kStep n.
    // The rows' tokens and heads are stepped, not divided out each time,
    // and every load comes before the first store (no branch between
    // them). As a loop of division, shared load and store a row, a
    // warpgroup's store took ~3,550 cycles at 4k tokens; this way ~2,100
    // (H200, session 29, per-block timeline: bench/gpu/prefill_trace.py).
    constexpr int kIters = 16 * kChunks / 32;
    constexpr int kStep = 32 / kChunks;
    const int c = b.lane % kChunks;
    const int r0 = wrow + b.lane / kChunks;
    RowWalk<kHd, kStep> rw(a, b, r0);
    uint4 v[kIters];
    int64_t off[kIters];
#pragma unroll
    for (int n = 0; n < kIters; ++n) {
      v[n] = *reinterpret_cast<const uint4*>(smem_q + swz(kM, r0 + kStep * n, c));
      off[n] = rw.offset();
      if (off[n] >= 0) off[n] += c * 8;
      rw.next();
    }
    T* out = static_cast<T*>(a.out);
#pragma unroll
    for (int n = 0; n < kIters; ++n) {
      if (off[n] >= 0) *reinterpret_cast<uint4*>(out + off[n]) = v[n];
    }
  }
};
#endif  // OSP_WGMMA_DEVICE

// kPvLate: P_{t-1} V_{t-1} issued after the copies of tile t (variant 4),
// else right after S_t (variant 1).
template <bool kF16, bool kPvLate>
__global__ void __launch_bounds__(kThreads, 1) prefill_wgmma_kernel(PagedAttentionArgs a, int tiles_per_seq) {
#if OSP_WGMMA_DEVICE
  using T = std::conditional_t<kF16, __half, __nv_bfloat16>;
  constexpr int kHd = 128;
  constexpr int kChunks = Hd128::kChunks;
  constexpr uint32_t kKvTile = Hd128::kKvTile;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  WgBlock b;
  if (!wg_block(a, tiles_per_seq, smem_raw, b)) return;
  int* sSlot = reinterpret_cast<int*>(b.smem + kOffSlot);
  int* sHi = reinterpret_cast<int*>(b.smem + kOffHi);
  const int tid = b.tid;
  const int wrow = 16 * b.warp;  // first row of this warp within the block

  // q -> sQ; completes with K_0's group.
  load_q<T, kHd, kThreads>(a, b);
  int hi[2], lo[2];
  key_bounds(a, b, wrow, true, hi, sHi, lo, nullptr);

  const KvPages<T> kv(a, b.seq, b.kvh);
  __syncthreads();  // sHi
  const int tile_hi = block_key_bound<kThreads / 32>(sHi);
  const int nt = (tile_hi + kN - 1) / kN;  // key tiles of this block
  // K/V row of key kp, -1 from tile_hi on (zero-filled).
  auto slot_of = [&](int kp) {
    if (kp >= tile_hi) return -1;
    return kv.row(kp);
  };

  // This thread's copies of a K or V tile: chunk tid % 16 of keys
  // tid / 16 + 16 n (so the swizzle term (c ^ key) % 8 is fixed per thread).
  const int cp_c = tid & (kChunks - 1);
  const int cp_j = tid / kChunks;
  const uint32_t cp_dst = swz(kN, cp_j, cp_c);
  const char* cp_k = reinterpret_cast<const char*>(kv.k) + cp_c * 16;  // chunk cp_c of K row 0
  const char* cp_v = reinterpret_cast<const char*>(kv.v) + cp_c * 16;
  auto load_tile = [&](uint32_t dst_off, int slot_ring, const char* chunk_base) {
    const int* slots = sSlot + slot_ring * kN;
#pragma unroll
    for (int n = 0; n < kCopies; ++n) {
      const int row = slots[cp_j + n * (kThreads / kChunks)];
      cp_async16(b.smem + dst_off + cp_dst + n * (kThreads / kChunks) * 128, kv_chunk_src<T, kHd>(chunk_base, row),
                 row >= 0 ? 16 : 0);
    }
  };

  if (nt > 0) {  // block-uniform
    if (tid < kN) {
      sSlot[tid] = slot_of(tid);
      sSlot[kN + tid] = slot_of(kN + tid);
    }
    __syncthreads();
    load_tile(kOffK, 0, cp_k);
  }
  cp_async_commit();  // Q (+ K_0)

  float o[kHd / 2];  // this warpgroup's rows (WgRows)
  float s[64];
  uint32_t pa[8][4];
  float m[2], l[2];
  WgRows<kF16, kHd> w(o, s, pa, m, l, hi, lo, a.scale);
  auto v_addr = [&](int t) { return b.sbase + kOffV + static_cast<uint32_t>(t & 1) * kKvTile; };

  // One key tile; first (t == 0): no P V to issue yet. (Peeled rather than
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
    if constexpr (kFirst) w.load_q(b.smem + kOffQ, wrow, b.g, b.t4);

    // S = Q K_t^T, then O += P_{t-1} V_{t-1}, both in flight while this
    // thread issues the copies of K_{t+1} and V_t below (kPvLate: P V after
    // the copies, by when the other warpgroup has usually issued its S too).
    w.pin_all();
    wgmma::fence();
    w.issue_s(b.sbase + kOffK + static_cast<uint32_t>(t & 1) * kKvTile);
    if constexpr (!kFirst && !kPvLate) w.issue_pv(v_addr(t - 1));
    if (t + 1 < nt) load_tile(kOffK + static_cast<uint32_t>((t + 1) & 1) * kKvTile, (t + 1) % 3, cp_k);
    load_tile(kOffV + static_cast<uint32_t>(t & 1) * kKvTile, t % 3, cp_v);
    cp_async_commit();
    if constexpr (!kFirst && kPvLate) w.issue_pv(v_addr(t - 1));
    // Page-table entries of tile t + 2, stored into the ring slot of tile
    // t - 1 (last read in iteration t - 1) after this tile's softmax.
    int next_slot = -1;
    if (tid < kN && t + 2 < nt) next_slot = slot_of(kb + 2 * kN + tid);
    w.wait_s(first);
    w.softmax(kb, b.t4);
    // Both arms wait (WgRows::wait_rescale).
    if (t + 2 < nt) {
      w.wait_rescale();
      if (tid < kN) sSlot[((t + 2) % 3) * kN + tid] = next_slot;
    } else {
      w.wait_rescale();
    }
    w.pack_p();
  };
  if (nt > 0) step(0, std::true_type{});
  for (int t = 1; t < nt; ++t) step(t, std::false_type{});

  if (nt > 0) {
    // V_{nt-1} landed for all threads.
    cp_async_wait<0>();
    wgmma::fence_proxy_async_shared();
    __syncthreads();
    w.pin_all();
    wgmma::fence();
    w.issue_pv(v_addr(nt - 1));
    w.wait_pv();
  } else {
    cp_async_wait<0>();  // the Q copies, before the staging below overwrites sQ
    __syncthreads();
  }
  w.store(a, b, wrow);
#else
  (void)a;
  (void)tiles_per_seq;
  __trap();  // not built for sm_90a: launch_prefill_attention_wgmma never launches this
#endif
}

// Warp-specialised variant: warpgroup 0 gathers K and V tiles with cp.async
// into a ring of four tile slots (item 2 t = K_t, item 2 t + 1 = V_t, slot
// i % 4) and signals each item on its "full" mbarrier once the copies have
// landed (cp.async.mbarrier.arrive: the copying threads never wait for
// their copies); warpgroups 1 and 2 compute (64 rows each, the same step as
// prefill_wgmma_kernel) and hand each item back on its "empty" mbarrier as
// soon as their wgmma have read it: K_t after S_t, V_{t-1} after
// P_{t-1} V_{t-1}. A step holds two items (V_{t-1}, K_t), so the copies run
// up to two items (one tile) ahead: measured on an H200 (2026-12-03,
// session 31), four slots were 1% faster than six at 4k and 8k tokens
// (head_dim 64: 2-3%); five were ahead of six in one call of two. No
// block-wide barrier in the key loop:
// the computing warpgroups drift apart and one's softmax overlaps the
// other's wgmma; setmaxnreg moves registers from the copying warpgroup to
// the computing ones. The copying threads load a tile's page-table entries
// together (KvPages::rows_of) before waiting for its slot: one at a time,
// each a dependent global load, they kept the computing warpgroups waiting
// for K/V (ncu: 19% of warp samples on the full barriers, H200, 4k tokens)
// and the kernel 20% slower.
//
// One-byte pages (kKv8: 1 F8_E4M3, 2 I8): the copying warpgroup gathers
// each item's bytes (128 keys x head_dim values) with cp.async into a
// two-item staging area, each thread into a share of its own, so no thread
// waits for another's copies: with item i + 1 still in flight it waits for
// its own copies of item i (cp.async.wait_group), widens them in
// registers (to F16 whatever T: the computing warpgroups then run in F16;
// F8 exactly, I8 as widen_i8x16 says) and stores them into
// the item's ring slot, then arrives on the slot's full barrier
// (mbarrier.arrive, release) and issues its copies of item i + 2 into the
// staging half it has just read. Five ring slots make room for the staging
// area. F8: the layer's K scale goes
// on the scores, its V scale on the output. I8: each key's K and V row
// scales are staged beside its codes (4-byte cp.async by one thread a key)
// and the widening writes c * s in F16 (the layer scales are 1).
constexpr int kWsThreads = 384;
constexpr int kWsCopyRegs = 56;      // per thread, copying warpgroup
constexpr int kWsComputeRegs = 224;  // per thread, computing warpgroups
// setmaxnreg moves registers within the block's allocation at launch (168
// a thread: 65536 / 384 rounded down to a multiple of 8); asking for more
// blocks the raising warpgroups for ever.
static_assert(kWsCopyRegs * 128 + kWsComputeRegs * 256 <= kWsThreads * 168, "register pool of the block");
// Shared memory of the warp-specialised kernel: Q, the ring of kSlots K or
// V tiles, (one-byte pages) the staging area, (I8) the staged row scales,
// the barriers and the per-warp key bounds.
// (Measured on an H200, 2026-11-28: three F8 items staged with four ring
// slots gave nothing over two with five.)
template <int kKv8, int kHd>
struct WsLayout {
  static constexpr uint32_t kKvTile = HdTiles<kHd>::kKvTile;
  static constexpr int kStages = 2;                                   // one-byte pages: items staged
  static constexpr int kSlots = kKv8 ? 5 : 4;                         // K or V tiles in the ring
  static constexpr uint32_t kStageItem = kN * kHd;                    // one-byte pages: an item's bytes
  static constexpr uint32_t kOffSlot = kOffQ + HdTiles<kHd>::kQTile;  // slot s: one K or V tile
  static constexpr uint32_t kOffStage = kOffSlot + kSlots * kKvTile;  // [kStages][kStageItem]
  static constexpr uint32_t kOffScale = kOffStage + (kKv8 ? kStages * kStageItem : 0);  // I8: float [kStages][kN]
  static constexpr uint32_t kOffEnt = kOffScale + (kKv8 == 2 ? kStages * kN * 4 : 0);  // one-byte: int [kN]
  // uint64_t full[kSlots], empty[kSlots]
  static constexpr uint32_t kOffBar = kOffEnt + (kKv8 ? kN * 4 : 0);
  static constexpr uint32_t kOffHi = kOffBar + 2 * kSlots * 8;  // int [12]: per-warp largest key bound
  static constexpr uint32_t kOffLo = kOffHi + (kWsThreads / 32) * 4;  // int [12]: per-warp smallest first key
  static constexpr uint32_t kOffQBar = kOffLo + (kWsThreads / 32) * 4;  // uint64_t: the Q tile landed (q_tma)
  static constexpr uint32_t kSmemBytes = kOffQBar + 8 + 1024;
  static_assert(kOffQBar % 8 == 0, "mbarrier alignment");
  static_assert(kOffSlot % 1024 == 0 && kKvTile % 1024 == 0, "swizzle atoms on 1024-byte boundaries");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per block");
};

#if OSP_WGMMA_DEVICE
// The copying warpgroup's work: K_t and V_t (t < nt) as items 2 t and
// 2 t + 1 of the ring of kWsSlots tile slots at smem + kWsOffSlot. Item i
// lives in slot i % kWsSlots; its n-th use of that slot (n = i / kWsSlots)
// completes phase n of the slot's full barrier (filled) and then of its
// empty barrier (read).
// Every phase of a slot's barriers completes in item order (an item is
// filled only after the slot's previous item was read, and read only after
// it was filled), so a barrier is never two phases ahead of its waiter and
// the parity n & 1 names the phase. Thread p (of 128) copies chunk
// p % C of keys p / C + (128 / C) n of K_t and then of V_t (the same rows;
// C = kHd / 8 chunks a row: keys p / 16 + 8 n, n < 16, at head_dim 128),
// then has the hardware arrive on the item's full barrier once they have
// landed (.noinc: that arrival is one of the 128 the barrier expects). The
// computing threads order those writes before their wgmma reads with
// fence.proxy.async after their wait.
template <class T, int kHd>
__device__ __forceinline__ void copy_kv_items(const PagedAttentionArgs& a, const WgBlock& b, int key0, int tile_hi,
                                              int nt, uint32_t full_bar, uint32_t empty_bar) {
  using L = WsLayout<0, kHd>;
  constexpr int kWsSlots = L::kSlots;
  constexpr uint32_t kWsOffSlot = L::kOffSlot;
  constexpr int kChunks = HdTiles<kHd>::kChunks;
  constexpr int kStep = 128 / kChunks;  // keys apart: a multiple of 8
  constexpr int kKeys = kN / kStep;     // keys of this thread a tile
  static_assert(kStep % 8 == 0 && kKeys % 2 == 0, "copy pattern");
  const KvPages<T> kv(a, b.seq, b.kvh);
  const int c = b.tid & (kChunks - 1);
  const int j0 = static_cast<int>(static_cast<unsigned>(b.tid) / kChunks);  // (key % 8): j0 % 8 for all its keys
  const uint32_t dst0 = swz(kN, j0, c);
  const char* chunk_k = reinterpret_cast<const char*>(kv.k) + c * 16;  // chunk c of K row 0
  const char* chunk_v = reinterpret_cast<const char*>(kv.v) + c * 16;
  const uint32_t items = 2u * static_cast<uint32_t>(nt);
  // The loop, for a power-of-two block size or not (uniform branch).
  auto copy_items = [&](auto pow2) {
    constexpr bool kPow2 = decltype(pow2)::value;
    int rows[kKeys];  // K/V row of this thread's keys of the tile (KvPages::rows_of)
    for (uint32_t i = 0; i < items; ++i) {
      const uint32_t st = i % kWsSlots;
      if ((i & 1) == 0) {
        // In two halves (of 8 keys at head_dim 128: 16 entries at once do
        // not fit the copying warpgroup's registers). Before the wait for
        // the slot, so that the page table's latency overlaps it.
        const int kb = key0 + static_cast<int>(i >> 1) * kN + j0;
        kv.template rows_of<kKeys / 2, kPow2>(kb, kStep, tile_hi, rows);
        kv.template rows_of<kKeys / 2, kPow2>(kb + kN / 2, kStep, tile_hi, rows + kKeys / 2);
      }
      if (i >= kWsSlots) wgmma::mbar_wait(empty_bar + 8 * st, ((i / kWsSlots) - 1) & 1u);
      const char* chunk_base = (i & 1) ? chunk_v : chunk_k;
      unsigned char* dst = b.smem + kWsOffSlot + st * L::kKvTile + dst0;
#pragma unroll
      for (int n = 0; n < kKeys; ++n) {
        cp_async16(dst + n * kStep * 128, kv_chunk_src<T, kHd>(chunk_base, rows[n]), rows[n] >= 0 ? 16 : 0);
      }
      wgmma::cp_async_mbar_arrive_noinc(full_bar + 8 * st);
    }
  };
  if (kv.bs_pow2) {
    copy_items(std::true_type{});
  } else {
    copy_items(std::false_type{});
  }
}

// copy_kv_items by the bulk tensor copy engine (kTma: pages of the 16-bit
// type, a power-of-two page size >= 8), run by the four warps of the copying
// warpgroup: each K or V tile is kN / box boxes of `box` = min(bs, kN)
// rows, one a page (or kN rows of one page), each box a TMA copy per
// 64-element panel straight into its ring slot in the 128-byte swizzle
// the wgmma descriptors read (a box's rows start on a multiple of 8, so
// its swizzle phase is the tile's). Lane j of every warp loads box j's
// page-table entry; warp w issues the boxes j with j % 4 == w, each warp
// after its own wait for the slot. (With one warp issuing them all, the
// lanes' copies went out one after another through uniform registers, and
// TMA lost to cp.async at head_dim 128; with four it wins by 13-15%: H200,
// session 28.) The item's full barrier expects one arrival (warp 0's lane
// 0, with the item's TMA bytes: the other warps' boxes may land first, the
// count of bytes going below 0 until then, but the phase needs that
// arrival too); boxes past the block's key range read the slot coordinate
// past the pool, which the engine fills with zeros. The box holding the
// range's end is copied row by row with cp.async instead, zero-filled
// past it (a TMA box would bring whatever the page holds there, and P = 0
// times a non-finite stale V is NaN); those copies arrive on the barrier
// without .noinc, before lane 0's arrival, so the phase also waits for
// them (warp 0 copies that box). Why TMA (ncu, H200, session 26, 4k
// tokens): copy_kv_items' 128 threads spent 444 warp instructions a tile
// on page-table loads and 16-byte copies, and the computing warpgroups
// waited on the K tiles' full barriers.
template <class T, int kHd>
__device__ __forceinline__ void copy_kv_items_tma(const PagedAttentionArgs& a, const WgBlock& b, int key0, int tile_hi,
                                                  int nt, uint32_t full_bar, uint32_t empty_bar, const void* tmk,
                                                  const void* tmv) {
  using L = WsLayout<0, kHd>;
  constexpr int kPanels = HdTiles<kHd>::kPanels;
  constexpr int kChunks = HdTiles<kHd>::kChunks;
  const int lane = b.lane;
  const int wq = b.warp & 3;  // this warp's share of the boxes: j % 4 == wq (warp 0: also the partial box)
  if (lane == 0 && wq == 0) {
    wgmma::prefetch_tmap(tmk);
    wgmma::prefetch_tmap(tmv);
  }
  const KvPages<T> kv(a, b.seq, b.kvh);
  const int bs = kv.bs;
  const int box = min(bs, kN);  // rows of one box
  const int boxes = kN / box;   // boxes of a tile (<= 16)
  const int oob = a.num_blocks * bs;  // a slot coordinate past the pool: zeros
  for (int t = 0; t < nt; ++t) {
    const int kt = key0 + t * kN;
    const int kb = kt + lane * box;  // first key of box `lane`
    const bool in = lane < boxes && kb < tile_hi;
    const int slot = in ? kv.pages[kb >> kv.bs_shift] * bs + (kb & (bs - 1)) : oob;
    const bool partial = in && kb + box > tile_hi;
    const unsigned pmask = __ballot_sync(0xffffffffu, partial);
#pragma unroll 1
    for (int h = 0; h < 2; ++h) {  // K_t, then V_t
      const uint32_t i = 2u * static_cast<uint32_t>(t) + static_cast<uint32_t>(h);
      const uint32_t st = i % L::kSlots;
      if (i >= L::kSlots) wgmma::mbar_wait(empty_bar + 8 * st, ((i / L::kSlots) - 1) & 1u);
      const uint32_t bar = full_bar + 8 * st;
      const uint32_t tile_off = L::kOffSlot + st * L::kKvTile;
      if (pmask != 0 && wq == 0) {
        const int pb = __ffs(pmask) - 1;
        const int pslot = __shfl_sync(0xffffffffu, slot, pb);
        const int valid = tile_hi - (kt + pb * box);  // rows of the box in the range (1 .. box - 1)
        const char* cache = reinterpret_cast<const char*>(h ? kv.v : kv.k);
        for (int j = lane; j < box * kChunks; j += 32) {
          const int r = j / kChunks;
          const int c = j - r * kChunks;
          const int row = r < valid ? (pslot + r) * a.hk + b.kvh : -1;  // K/V row (KvPages::row_in), -1: zeros
          cp_async16(b.smem + tile_off + swz(kN, pb * box + r, c), kv_chunk_src<T, kHd>(cache + c * 16, row),
                     row >= 0 ? 16 : 0);
        }
        wgmma::cp_async_mbar_arrive(bar);
      }
      __syncwarp();
      if (lane == 0 && wq == 0) {
        const int tma_boxes = boxes - (pmask != 0 ? 1 : 0);
        wgmma::mbar_arrive_expect_tx(bar, static_cast<uint32_t>(tma_boxes * box * 128 * kPanels));
      }
      __syncwarp();
      if (lane < boxes && !partial && (lane & 3) == wq) {
#pragma unroll
        for (int p = 0; p < kPanels; ++p) {
          wgmma::tma_load_3d(b.sbase + tile_off + p * kKvPanel + static_cast<uint32_t>(lane * box) * 128u,
                             h ? tmv : tmk, 64 * p, b.kvh, slot, bar);
        }
      }
    }
  }
}

// Sixteen E4M3 codes (16 bytes, lowest first) as sixteen F16 values
// (exact), lo = the first 8; one cvt.rn.f16x2.e4m3x2 a pair. F16 whatever
// q's type: the warp-specialised kernel computes in F16 over F8_E4M3 pages
// (session 32). Until then BF16 q took BF16 values, by way of fp32 (four
// instructions a pair), and ran 8% behind F16 q; session 21 had measured
// the F16 computation across machines only (-2% to +4%) and not kept it;
// session 32 measured +9-10% in one call. Measured on an H200 (2026-11-28):
// integer moves and a 16-bit multiply a pair instead of the conversion made
// the kernel 7-14% slower (the copying warpgroup's instructions, not the
// conversion unit, compete with the computing warpgroups). (Written over a
// copy of the four words: reading w's members in place, the caller's
// 16-byte shared load compiled to four 4-byte ones.)
__device__ __forceinline__ void widen_e4m3x16(const uint4& w, uint4& lo, uint4& hi) {
  const uint32_t in[4] = {w.x, w.y, w.z, w.w};
  uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) out[i] = e4m3x2_to_half2_bits(in[i / 2] >> (16 * (i % 2)));
  lo = make_uint4(out[0], out[1], out[2], out[3]);
  hi = make_uint4(out[4], out[5], out[6], out[7]);
}

// The largest I8 row scale the F16 widening takes: 127 times it (65,405)
// stays below F16's largest finite value, so a row whose values pass
// F16's range saturates (as BF16 q does when the kernel rounds it to F16)
// instead of becoming infinite.
constexpr float kI8F16MaxRowScale = 515.0f;

// Sixteen I8 codes (16 bytes, lowest first) times the row scale sc as F16,
// lo = the first 8. Each pair: its bytes, sign bits flipped, into the low
// mantissa bits of two halves (a byte permute) of 1024, where a mantissa
// step is 1, and the bias 1024 + 128 subtracted (exact: the codes); then
// one multiply by sc (clamped to kI8F16MaxRowScale) rounded to F16. For a
// scale below F16's normal range (rows of magnitude below ~0.008) the
// halves are of 2^-6 instead, where a step is 2^-16 (the subtraction gives
// c 2^-16 exactly, subnormal or not), and the multiply is by sc 2^16, so
// the scale keeps F16's 11 significant bits; either way one rounding. Until
// session 35 the codes became floats (i8x4_to_float: a permute and an add
// each), were multiplied by sc in fp32 and rounded to q's type: ~60
// instructions for 16 codes against ~28, on the copying warpgroup, which
// bounds one-byte pages' prompt attention. (With int-to-float conversions,
// before session 25, the kernel took 2.4x FP8 pages' time.)
__device__ __forceinline__ void widen_i8x16(const uint4& w, float sc, uint4& lo, uint4& hi) {
  const bool tiny = sc < 6.103515625e-05f;  // 2^-14
  const float s = tiny ? sc * 65536.0f : sc;
  // Not fminf: a NaN scale (a row written from NaN values) stays NaN, as
  // the other kernels' c * s.
  const __half2 s1 = __float2half2_rn(s > kI8F16MaxRowScale ? kI8F16MaxRowScale : s);
  const uint32_t top = tiny ? 0x24u : 0x64u;  // the halves' high byte: 2^-6 or 1024
  const uint32_t bias = tiny ? 0x24802480u : 0x64806480u;
  const uint32_t in[4] = {w.x ^ 0x80808080u, w.y ^ 0x80808080u, w.z ^ 0x80808080u, w.w ^ 0x80808080u};
  uint32_t out[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t c = (i & 1) ? i8x2_flipped_to_half2_bits<1>(in[i / 2], top, bias)
                               : i8x2_flipped_to_half2_bits<0>(in[i / 2], top, bias);
    const __half2 v = __hmul2(*reinterpret_cast<const __half2*>(&c), s1);
    out[i] = *reinterpret_cast<const uint32_t*>(&v);
  }
  lo = make_uint4(out[0], out[1], out[2], out[3]);
  hi = make_uint4(out[4], out[5], out[6], out[7]);
}

// The thread whose staged codes thread p widens in copy_kv_items_8. Head
// dim 128 (8 byte chunks a key, c = p % 8): lanes with c >= 4 take those
// of the other key of their pair (p / 8 XOR 1), so each quarter-warp (the
// 8 lanes one 16-byte shared access serves at a time) widens chunks 0..3
// of one key and 4..7 of a key of the other parity. Its 16-bit stores,
// chunks 2 c and 2 c + 1 XORed with the rows' swizzle, then fall in 8
// distinct 16-byte bank groups, and its staging loads still do (c = p % 8
// spans the 8). Widening its own codes, a quarter-warp stored one key's
// chunks, whose even 16-bit chunks met in 4 bank groups: a two-way
// conflict on every store (ncu, session 33: 9.6 M conflicts at a 4k FP8
// prompt). The copies stay one key's 128 bytes a quarter-warp: with the
// lanes remapped for the copies too the conflicts fell to 1.5 M but the
// kernel was 6-7% slower (session 33). Head_dim 64 (4 chunks a key): a
// quarter-warp already spans two keys; pw = p.
template <int kByteChunks>
__device__ __forceinline__ int ws_widen_thread(int p) {
  static_assert(kByteChunks == 8 || kByteChunks == 4, "head_dim 64 or 128");
  return kByteChunks == 8 ? p ^ ((p & 4) << 1) : p;
}

// copy_kv_items for one-byte pages (kKv8: 1 F8_E4M3, 2 I8; WsLayout<kKv8,
// kHd>; the scheme is in the comment above kWsThreads). Thread p owns byte
// chunk c = p % 8 (values 16 c .. 16 c + 15) of keys p / 8 + 16 n (n =
// 0..7) of every item (at head_dim 64: c = p % 4 of keys p / 4 + 32 n, n =
// 0..3): its staging share is 16 bytes at (n * 128 + p) * 16 of a staging
// half. It widens the share of thread pw = ws_widen_thread(p) (of its
// warp: the same chunk c, of keys pw / 8 + 16 n) into 16-bit chunks 2 c
// and 2 c + 1 of those rows. I8: the thread with c = 0 also copies its
// keys' row scales of the item (K scales for K items, V for V) into the
// item's scale half; the lanes of a key (the same warp) read them after a
// __syncwarp. kF16: the type the codes widen to, F16 (the kernel computes
// in F16 over one-byte pages; until session 35 I8 codes widened to q's
// type).
template <bool kF16, int kHd, int kKv8>
__device__ __forceinline__ void copy_kv_items_8(const PagedAttentionArgs& a, const WgBlock& b, int key0, int tile_hi,
                                                int nt, uint32_t full_bar, uint32_t empty_bar) {
  using L = WsLayout<kKv8, kHd>;
  constexpr bool kI8 = kKv8 == 2;
  constexpr int kStages = L::kStages;
  static_assert(kStages == 2, "K items in staging half 0, V items in half 1: the scale halves too");
  constexpr int kByteChunks = kHd / 16;     // 16-byte chunks of a row of codes
  constexpr int kStep = 128 / kByteChunks;  // keys apart: a multiple of 8
  constexpr int kKeys = kN / kStep;         // keys of this thread an item
  static_assert(kStep % 8 == 0 && kKeys * 128 * 16 == static_cast<int>(L::kStageItem), "copy pattern");
  static_assert(kKeys == kByteChunks, "a key's lanes copy its tile's page-table entries, one each");
  const KvPages<uint8_t> kv(a, b.seq, b.kvh);
  const int c = b.tid & (kByteChunks - 1);
  const int j0 = static_cast<int>(static_cast<unsigned>(b.tid) / kByteChunks);  // (key % 8): j0 % 8 for all its keys
  const int pw = ws_widen_thread<kByteChunks>(b.tid);
  const int jw = pw / kByteChunks;  // the keys this thread widens: jw + kStep n (chunk c)
  const uint32_t dst_lo = swz(kN, jw, 2 * c);
  const uint32_t dst_hi = swz(kN, jw, 2 * c + 1);
  const char* chunk_k = reinterpret_cast<const char*>(kv.k) + c * 16;
  const char* chunk_v = reinterpret_cast<const char*>(kv.v) + c * 16;
  unsigned char* stage = b.smem + L::kOffStage + b.tid * 16;
  const unsigned char* wstage = b.smem + L::kOffStage + pw * 16;  // the staging share it widens
  // I8: [kStages][kStep][kKeys]: key j + kStep n's scale at [j][n], so that
  // a widening thread reads the scales of kAhead keys in one load.
  float* scales = reinterpret_cast<float*>(b.smem + L::kOffScale);
  int* sEnt = reinterpret_cast<int*>(b.smem + L::kOffEnt);           // [kN]: page-table entries of a tile's keys
  const uint32_t items = 2u * static_cast<uint32_t>(nt);
  auto copy_items = [&](auto pow2) {
    constexpr bool kPow2 = decltype(pow2)::value;
    int rows[kKeys];    // K/V row of this thread's keys of the tile
    int srows[kKeys];  // I8: their row scales' index (KvPages::rows_from)
    auto keys_of = [&](uint32_t t) { return key0 + static_cast<int>(t) * kN + j0; };
    // Item i's copies into staging part i % kStages, committed as one
    // group (an empty group past the last item, so that every wait below
    // counts the same); item 2 t finds the rows of tile t, item 2 t + 1
    // (issued next) reuses them. The rows come from page-table entries in
    // sEnt: tile 0's copied and waited for before the first item, tile
    // t + 1's copied with item 2 t's group, which the lanes wait for (and
    // __syncwarp) an iteration before item 2 t + 2 reads them, so the
    // copying thread does not wait for a dependent global load before each
    // K item.
    // Tile t's page-table entries into sEnt, one a lane: lane c of keys
    // j0 + kStep n copies key j0 + kStep c's (kKeys == kByteChunks).
    auto copy_entries = [&](uint32_t t) {
      const int kp = min(keys_of(t) + c * kStep, tile_hi - 1);
      cp_async4(sEnt + j0 + c * kStep, kv.pages + kv.template page_of<kPow2>(kp), 4);
    };
    auto issue = [&](uint32_t i) {
      if (i < items) {
        if ((i & 1) == 0) {
          const uint32_t t = i >> 1;
          int entry[kKeys];
#pragma unroll
          for (int n = 0; n < kKeys; ++n) entry[n] = sEnt[j0 + n * kStep];
          kv.template rows_from<kKeys, kPow2>(keys_of(t), kStep, tile_hi, entry, rows, kI8 ? srows : nullptr);
          __syncwarp();  // the lanes have read sEnt before it is refilled
          if (t + 1 < static_cast<uint32_t>(nt)) copy_entries(t + 1);
        }
        const char* chunk_base = (i & 1) ? chunk_v : chunk_k;
        unsigned char* dst = stage + (i % kStages) * L::kStageItem;
#pragma unroll
        for (int n = 0; n < kKeys; ++n) {
          cp_async16(dst + n * 128 * 16, kv_chunk_src<uint8_t, kHd>(chunk_base, rows[n]), rows[n] >= 0 ? 16 : 0);
        }
        if constexpr (kI8) {
          if (c == 0) {
            const float* rs = (i & 1) ? a.v_row_scales : a.k_row_scales;
            float* sdst = scales + (i % kStages) * kN + j0 * kKeys;
#pragma unroll
            for (int n = 0; n < kKeys; ++n) {
              cp_async4(sdst + n, rs + srows[n], rows[n] >= 0 ? 4 : 0);
            }
          }
        }
      }
      cp_async_commit();
    };
    copy_entries(0);  // nt > 0
    cp_async_commit();
    cp_async_wait<0>();
    __syncwarp();
#pragma unroll
    for (int i = 0; i < kStages; ++i) issue(i);
    for (uint32_t i = 0; i < items; ++i) {
      const uint32_t st = i % L::kSlots;
      cp_async_wait<kStages - 1>();  // item i landed; the next kStages - 1 may still be in flight
      __syncwarp();  // and what the warp's other lanes copied: the share it widens, the scales (I8), sEnt
      if (i >= L::kSlots) wgmma::mbar_wait(empty_bar + 8 * st, ((i / L::kSlots) - 1) & 1u);
      const unsigned char* src = wstage + (i % kStages) * L::kStageItem;
      unsigned char* dst = b.smem + L::kOffSlot + st * L::kKvTile;
      // Staging loads issued ahead of their widening (session 34: FP8
      // pages' prompt attention +9-10% at head_dim 128, INT8 +3% in the
      // model; at head_dim 64 FP8 lost 2-4%, so it keeps one at a time).
      // I8: two (four spilled).
      constexpr int kAhead = kHd == 64 ? 1 : kI8 ? 2 : 4;
      static_assert(kKeys % kAhead == 0, "whole groups of staging loads");
      [[maybe_unused]] const float* wscales = scales + (i % kStages) * kN + jw * kKeys;  // I8: this thread's keys'
#pragma unroll
      for (int n0 = 0; n0 < kKeys; n0 += kAhead) {
        uint4 w[kAhead];
        [[maybe_unused]] float sc[kAhead];  // I8: the keys' scales, loaded with their codes (one 4- or 8-byte load)
        if constexpr (kI8) {
          static_assert(kAhead == 1 || kAhead == 2, "a float or a float2 of scales");
          if constexpr (kAhead == 2) {
            const float2 f = *reinterpret_cast<const float2*>(wscales + n0);
            sc[0] = f.x;
            sc[1] = f.y;
          } else {
            sc[0] = wscales[n0];
          }
        }
#pragma unroll
        for (int g = 0; g < kAhead; ++g) w[g] = *reinterpret_cast<const uint4*>(src + (n0 + g) * 128 * 16);
#pragma unroll
        for (int g = 0; g < kAhead; ++g) {
          const int n = n0 + g;
          uint4 lo, hi;
          if constexpr (kI8) {
            static_assert(kF16, "I8 codes widen to F16 (the kernel computes in F16 over one-byte pages)");
            widen_i8x16(w[g], sc[g], lo, hi);
          } else {
            static_assert(kF16, "E4M3 codes widen to F16 (the kernel computes in F16 over them)");
            widen_e4m3x16(w[g], lo, hi);
          }
          *reinterpret_cast<uint4*>(dst + dst_lo + n * kStep * 128) = lo;
          *reinterpret_cast<uint4*>(dst + dst_hi + n * kStep * 128) = hi;
        }
      }
      // The stores before the computing warpgroups' wgmma reads (they also
      // fence after their wait), and before the next copies into the
      // staging part just read: thread pw's into the share this thread
      // widened (I8: and lane c = 0's into the scales the keys' lanes read).
      wgmma::fence_proxy_async_shared();
      wgmma::mbar_arrive(full_bar + 8 * st);
      __syncwarp();
      issue(i + kStages);
    }
  };
  if (kv.bs_pow2) {
    copy_items(std::true_type{});
  } else {
    copy_items(std::false_type{});
  }
}
#endif  // OSP_WGMMA_DEVICE

// kPingpong: the two computing warpgroups take turns to issue their wgmma
// (named barriers 1 and 2), so that one's softmax runs while the other's
// matrix products do.
// kKv8: one-byte pages (copy_kv_items_8: 1 F8_E4M3, 2 I8), q and out of
// the 16-bit type; 0: pages of that type. kHd: head_dim, 64 or 128.
// kTma (kKv8 0 only): K/V tiles by the bulk tensor copy engine
// (copy_kv_items_tma, tensor maps tmk and tmv); else tmk and tmv are unused.
template <bool kF16, bool kPingpong, int kKv8, int kHd, bool kTma>
__global__ void __launch_bounds__(kWsThreads, 1)
    prefill_wgmma_ws_kernel(PagedAttentionArgs a, int tiles_per_seq, const __grid_constant__ CUtensorMap tmk,
                            const __grid_constant__ CUtensorMap tmv, const __grid_constant__ CUtensorMap tmq,
                            int q_tma) {
  static_assert(!kTma || kKv8 == 0, "TMA copies pages of the 16-bit type");
#if OSP_WGMMA_DEVICE
  using T = std::conditional_t<kF16, __half, __nv_bfloat16>;
  // The products' type: T, except over one-byte pages, which always compute
  // in F16 (as the decode kernel does): E4M3 codes widen to F16 exactly in
  // one conversion a pair (to BF16 by way of fp32: four), I8 codes in a
  // byte permute and a packed subtraction a pair (widen_i8x16), P in F16
  // has three more bits, and BF16 q is rounded to F16 (load_q).
  constexpr bool kCF16 = kF16 || kKv8 != 0;
  using L = WsLayout<kKv8, kHd>;
  constexpr int kWsSlots = L::kSlots;
  constexpr uint32_t kWsOffSlot = L::kOffSlot;
  constexpr uint32_t kWsOffBar = L::kOffBar;
  constexpr uint32_t kWsOffHi = L::kOffHi;
  constexpr uint32_t kWsOffLo = L::kOffLo;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  WgBlock b;
  if (!wg_block(a, tiles_per_seq, smem_raw, b)) return;
  int* sHi = reinterpret_cast<int*>(b.smem + kWsOffHi);
  int* sLo = reinterpret_cast<int*>(b.smem + kWsOffLo);
  const uint32_t full_bar = b.sbase + kWsOffBar;                  // + 8 s: slot s filled
  const uint32_t empty_bar = b.sbase + kWsOffBar + kWsSlots * 8;  // + 8 s: slot s read
  const int tid = b.tid;
  const int wg = b.warp >> 2;          // 0: copies; 1, 2: rows 64 (wg - 1) ..
  const int wrow = 16 * (b.warp - 4);  // first block row of a computing warp

  // q -> sQ: with q_tma (a launch-wide choice: q_tensor_map) thread 0
  // has the bulk tensor copy engine bring it, one box a 64-element panel
  // (rows token x head of the group, as the block's rows; tokens past the
  // step's are zeros, those of the next sequence are masked like any row
  // past the sequence), completing on the Q barrier, which only the
  // computing warpgroups wait for: the block barrier below no longer waits
  // for q, so the copying warpgroup starts the first K/V tile as soon as the
  // key bounds are known. Else every thread copies its share (load_q).
  const uint32_t q_bar = b.sbase + L::kOffQBar;
  auto init_bars = [&] {
    for (int st = 0; st < kWsSlots; ++st) {
      wgmma::mbar_init(full_bar + 8 * st, kTma ? 1 : 128);  // one arrival per copying thread (kTma: one)
      wgmma::mbar_init(empty_bar + 8 * st, 8);   // one arrival per computing warp
    }
    wgmma::mbar_init(q_bar, 1);
    wgmma::fence_mbar_init();
  };
  if (q_tma != 0) {
    if (tid == 0) {
      init_bars();
      wgmma::mbar_arrive_expect_tx(q_bar, HdTiles<kHd>::kQTile);
      const int group = b.rows.group;
#pragma unroll
      for (int p = 0; p < HdTiles<kHd>::kPanels; ++p) {
        wgmma::tma_load_3d(b.sbase + kOffQ + static_cast<uint32_t>(p) * kQPanel, &tmq, 64 * p, b.kvh * group,
                           b.rows.q_begin + b.rows.row0 / group, q_bar);
      }
    }
  } else {
    load_q<T, kHd, kWsThreads>(a, b);
    cp_async_commit();
  }
  int hi[2], lo[2];
  key_bounds(a, b, wrow, wg > 0, hi, sHi, lo, sLo);
  if (q_tma == 0 && tid == 0) init_bars();
  cp_async_wait<0>();
  wgmma::fence_proxy_async_shared();
  __syncthreads();  // sQ (q_tma: not yet), sHi, sLo, barriers
  // Key tiles t0 .. of the sequence (t0 > 0 only under a sliding window),
  // counted from 0 below: tile t holds keys key0 + t kN ..
  const int tile_hi = block_key_bound<kWsThreads / 32>(sHi);
  const int tiles_all = (tile_hi + kN - 1) / kN;
  const int t0 = min(block_key_lo<kWsThreads / 32>(sLo) / kN, tiles_all);
  const int key0 = t0 * kN;
  const int nt = tiles_all - t0;

  // Items 0 .. 2 nt - 1 (K_0, V_0, K_1, ..) in the ring (copy_kv_items).
  if (wg == 0) {
    // Copying warpgroup (copy_kv_items).
    wgmma::regs_dec<kWsCopyRegs>();
    if constexpr (kKv8 != 0) {
      if (nt > 0) copy_kv_items_8<kCF16, kHd, kKv8>(a, b, key0, tile_hi, nt, full_bar, empty_bar);
    } else if constexpr (kTma) {
      copy_kv_items_tma<T, kHd>(a, b, key0, tile_hi, nt, full_bar, empty_bar, &tmk, &tmv);
    } else {
      copy_kv_items<T, kHd>(a, b, key0, tile_hi, nt, full_bar, empty_bar);
    }
    cp_async_commit();  // no copy of this thread outlives it
    cp_async_wait<0>();
  } else {
    wgmma::regs_inc<kWsComputeRegs>();
    float o[kHd / 2];  // this warpgroup's rows (WgRows)
    float s[64];
    uint32_t pa[8][4];
    float m[2], l[2];
    WgRows<kCF16, kHd> w(o, s, pa, m, l, hi, lo, kKv8 != 0 ? a.scale * a.k_scale : a.scale);
    if (q_tma != 0) wgmma::mbar_wait(q_bar, 0);
    w.template load_q<kF16>(b.smem + kOffQ, wrow, b.g, b.t4);
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
    auto item_addr = [&](int i) { return b.sbase + kWsOffSlot + static_cast<uint32_t>(i % kWsSlots) * L::kKvTile; };
    // Waits for item i filled (the caller then orders the copies before its
    // wgmma reads: fence.proxy.async).
    auto wait_full = [&](int i) {
      wgmma::mbar_wait(full_bar + 8 * (i % kWsSlots), static_cast<uint32_t>(i / kWsSlots) & 1u);
    };
    // Hands item i back (its wgmma have completed: after the wait_group).
    auto release = [&](int i) {
      if (b.lane == 0) wgmma::mbar_arrive(empty_bar + 8 * (i % kWsSlots));
    };
    // One key tile, as in prefill_wgmma_kernel's step, with the item ring
    // in place of the block barrier.
    auto step = [&](const int t, auto first) {
      constexpr bool kFirst = decltype(first)::value;
      wait_full(2 * t);
      if constexpr (!kFirst) wait_full(2 * t - 1);
      wgmma::fence_proxy_async_shared();
      w.pin_all();
      my_turn();
      wgmma::fence();
      w.issue_s(item_addr(2 * t));
      if constexpr (!kFirst) w.issue_pv(item_addr(2 * t - 1));
      your_turn();
      w.wait_s(first);
      release(2 * t);  // K_t read
      w.softmax(key0 + t * kN, b.t4);
      // Both arms wait (WgRows::wait_rescale); V_{t-1} is handed back
      // where the copying warpgroup still needs its slot
      // (item 2 t - 1 + kWsSlots < 2 nt).
      if (!kFirst && 2 * t - 1 + kWsSlots < 2 * nt) {
        w.wait_rescale();
        release(2 * t - 1);
      } else {
        w.wait_rescale();
      }
      w.pack_p();
    };
    if (nt > 0) step(0, std::true_type{});
    for (int t = 1; t < nt; ++t) step(t, std::false_type{});
    if (nt > 0) {
      wait_full(2 * nt - 1);
      wgmma::fence_proxy_async_shared();
      w.pin_all();
      my_turn();
      wgmma::fence();
      w.issue_pv(item_addr(2 * nt - 1));
      if (cw == 0) your_turn();
      w.wait_pv();
    }
    w.template store<kKv8 != 0, kF16>(a, b, wrow);
  }
#else
  (void)a;
  (void)tiles_per_seq;
  (void)tmk;
  (void)tmv;
  (void)tmq;
  (void)q_tma;
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
  const bool i8 = a.kv_dtype == DType::kI8 && a.k_row_scales != nullptr && a.v_row_scales != nullptr;
  return prefill_attention_supported(a) && (a.kv_dtype == a.act || a.kv_dtype == DType::kF8E4M3 || i8) &&
         (a.hd == 128 || a.hd == 64) && a.window >= 0 && a.scale > 0.0f && aligned16(a.out) &&
         int64_t{a.num_blocks} * a.block_size * a.hk < int64_t{INT_MAX};
}

bool prefill_wgmma_supports(const PagedAttentionArgs& a, int variant) {
  if (variant == 0) variant = kPrefillWgmmaDefaultVariant;
  const bool ws = variant == 2 || variant == 3;  // the warp-specialised kernel
  return variant > 0 && variant < kNumPrefillWgmmaVariants && prefill_wgmma_supports(a) &&
         (a.kv_dtype == a.act || ws) && (a.hd == 128 || ws) && (a.window == 0 || ws);
}

namespace {

// The warp-specialised kernel (variant 2, or 3 with kPingpong) for a's
// head_dim and dtypes (tma: the bulk-tensor-copy build for pages of the
// 16-bit type), with its layout's shared memory.
using WsKernel = void (*)(PagedAttentionArgs, int, CUtensorMap, CUtensorMap, CUtensorMap, int);
struct WsLaunch {
  WsKernel kernel;
  uint32_t smem;
};

template <bool kPingpong>
WsLaunch ws_launch(const PagedAttentionArgs& a, bool tma) {
  const bool f16 = a.act == DType::kF16;
  auto pick = [&](auto kv8, auto hd, auto use_tma) -> WsLaunch {
    constexpr int kKv8 = decltype(kv8)::value;
    constexpr int kHd = decltype(hd)::value;
    constexpr bool kTma = decltype(use_tma)::value;
    return {f16 ? prefill_wgmma_ws_kernel<true, kPingpong, kKv8, kHd, kTma>
                : prefill_wgmma_ws_kernel<false, kPingpong, kKv8, kHd, kTma>,
            WsLayout<kKv8, kHd>::kSmemBytes};
  };
  auto by_pages = [&](auto hd) {  // kKv8: 1 F8_E4M3, 2 I8, 0 pages of the 16-bit type
    if (a.kv_dtype == DType::kF8E4M3) return pick(std::integral_constant<int, 1>{}, hd, std::false_type{});
    if (a.kv_dtype == DType::kI8) return pick(std::integral_constant<int, 2>{}, hd, std::false_type{});
    if (tma) return pick(std::integral_constant<int, 0>{}, hd, std::true_type{});
    return pick(std::integral_constant<int, 0>{}, hd, std::false_type{});
  };
  return a.hd == 64 ? by_pages(std::integral_constant<int, 64>{}) : by_pages(std::integral_constant<int, 128>{});
}

// cuTensorMapEncodeTiled from the driver (through the runtime: no link to
// libcuda), or nullptr where the driver does not give it.
using EncodeTiled = PFN_cuTensorMapEncodeTiled_v12000;
EncodeTiled encode_tiled() {
  static const EncodeTiled fn = []() -> EncodeTiled {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess || p == nullptr) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

// Whether the warp-specialised kernel copies a's K/V tiles with the bulk
// tensor copy engine. It can for pages of the 16-bit type of a power-of-two
// size of at least 8 rows (a box's 128-byte rows then start on a swizzle
// atom) in 16-byte aligned pools, and does wherever it can. Measured on an
// H200 (session 28, causal, 32 q / 8 KV heads, pages of 16, same binary),
// TMA against cp.async: 499 / 574-581 against 442-446 / 507-508 TFLOP/s at
// 4k / 8k tokens at head_dim 128, 540-545 against 476-477 at 8k with a
// 4096-key window, 490 / 577 against 439-445 / 503-506 with 28 q / 4 KV
// heads; at head_dim 64 it was the default already (session 26: 302 / 347
// against 296 / 335). Before its boxes were issued by four warps (session
// 27's branch), TMA lost at head_dim 128. Read at each launch:
// OSPREY_PREFILL_TMA=0 never takes it (A/B, tests); =1 is the default.
bool tma_shape(const PagedAttentionArgs& a) {
  const char* env = std::getenv("OSPREY_PREFILL_TMA");
  const bool off = env != nullptr && std::strcmp(env, "0") == 0;
  const int bs = a.block_size;
  const auto addr = reinterpret_cast<uintptr_t>(a.k_cache) | reinterpret_cast<uintptr_t>(a.v_cache);
  const bool can = a.kv_dtype == a.act && bs >= 8 && (bs & (bs - 1)) == 0 && addr % 16 == 0;
  return can && !off;
}

// The tensor maps of a's K and V pools for copy_kv_items_tma: [slots][hk]
// [hd] elements, boxes of 64 elements (a 128-byte row) x 1 head x
// min(bs, kN) slots, the 128-byte swizzle. False where tma_shape(a) does
// not hold or the driver cannot encode them.
bool kv_tensor_maps(const PagedAttentionArgs& a, CUtensorMap& k, CUtensorMap& v) {
  if (!tma_shape(a)) return false;
  const EncodeTiled enc = encode_tiled();
  if (enc == nullptr) return false;
  const cuuint64_t esz = 2;  // BF16 / F16
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(a.hd), static_cast<cuuint64_t>(a.hk),
                              static_cast<cuuint64_t>(int64_t{a.num_blocks} * a.block_size)};
  const cuuint64_t strides[2] = {a.hd * esz, static_cast<cuuint64_t>(a.hk) * a.hd * esz};
  const cuuint32_t box[3] = {64, 1, static_cast<cuuint32_t>(std::min(a.block_size, kN))};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUtensorMapDataType dt =
      a.act == DType::kF16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  auto one = [&](CUtensorMap& m, const void* base) {
    return enc(&m, dt, 3, const_cast<void*>(base), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
               CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  };
  return one(k, a.k_cache) && one(v, a.v_cache);
}

// The tensor map of a's q for the warp-specialised kernel's Q tile:
// [tokens][hq][hd] elements, boxes of 64 elements (a 128-byte row) x G
// heads x kM / G tokens (a block's rows: token-major, the group's heads
// within), the 128-byte swizzle (the Q tile's layout, swz). False where
// G does not divide kM, q is not 16-byte aligned, the driver cannot
// encode it, or OSPREY_PREFILL_TMA_Q=0 (A/B, tests; read at each launch):
// then every thread copies its share of q (load_q).
bool q_tensor_map(const PagedAttentionArgs& a, CUtensorMap& m) {
  const char* env = std::getenv("OSPREY_PREFILL_TMA_Q");
  if (env != nullptr && std::strcmp(env, "0") == 0) return false;
  const int group = a.hq / a.hk;
  if (kM % group != 0 || reinterpret_cast<uintptr_t>(a.q) % 16 != 0) return false;
  const EncodeTiled enc = encode_tiled();
  if (enc == nullptr) return false;
  const cuuint64_t esz = 2;  // BF16 / F16
  // Every row q holds: a sub-batch's token indices are absolute (a mixed
  // step's prompt part starts at token_offset; rows past the map's extent
  // would load as zeros).
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(a.hd), static_cast<cuuint64_t>(a.hq),
                              static_cast<cuuint64_t>(a.token_offset) + static_cast<cuuint64_t>(a.num_tokens)};
  const cuuint64_t strides[2] = {a.hd * esz, static_cast<cuuint64_t>(a.hq) * a.hd * esz};
  const cuuint32_t box[3] = {64, static_cast<cuuint32_t>(group), static_cast<cuuint32_t>(kM / group)};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUtensorMapDataType dt =
      a.act == DType::kF16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return enc(&m, dt, 3, const_cast<void*>(a.q), dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace

bool prefill_wgmma_q_tma(const PagedAttentionArgs& a) {
  CUtensorMap m{};
  return q_tensor_map(a, m);
}

bool prefill_wgmma_uses_tma(const PagedAttentionArgs& a, int variant) {
  if (variant == 0) variant = kPrefillWgmmaDefaultVariant;
  return (variant == 2 || variant == 3) && tma_shape(a) && encode_tiled() != nullptr;
}

void launch_prefill_attention_wgmma(const PagedAttentionArgs& a, cudaStream_t stream, int variant) {
  OSP_CHECK(prefill_wgmma_supports(a, variant));
  OSP_CHECK(prefill_wgmma_available());
  if (a.num_tokens == 0 || a.num_seqs == 0 || a.max_q_len == 0) return;
  if (variant == 0) variant = kPrefillWgmmaDefaultVariant;
  const int group = a.hq / a.hk;
  const int64_t tiles = (int64_t{a.max_q_len} * group + kM - 1) / kM;
  const int64_t blocks = static_cast<int64_t>(a.num_seqs) * tiles * a.hk;
  OSP_CHECK_LE(blocks, int64_t{2147483647});
  if (variant == 2 || variant == 3) {
    CUtensorMap tk{}, tv{}, tq{};
    const bool tma = kv_tensor_maps(a, tk, tv);
    const int q_tma = q_tensor_map(a, tq) ? 1 : 0;
    const WsLaunch l = variant == 2 ? ws_launch<false>(a, tma) : ws_launch<true>(a, tma);
    set_max_dynamic_smem_once(l.kernel, l.smem);
    l.kernel<<<static_cast<unsigned>(blocks), kWsThreads, l.smem, stream>>>(a, static_cast<int>(tiles), tk, tv, tq,
                                                                           q_tma);
  } else {
    const bool f16 = a.act == DType::kF16;
    void (*kernel)(PagedAttentionArgs, int) = nullptr;
    if (variant == 1) kernel = f16 ? prefill_wgmma_kernel<true, false> : prefill_wgmma_kernel<false, false>;
    if (variant == 4) kernel = f16 ? prefill_wgmma_kernel<true, true> : prefill_wgmma_kernel<false, true>;
    set_max_dynamic_smem_once(kernel, kSmemBytes);
    kernel<<<static_cast<unsigned>(blocks), kThreads, kSmemBytes, stream>>>(a, static_cast<int>(tiles));
  }
  OSP_CUDA_CHECK_LAUNCH();
}

}  // namespace osprey::cuda
