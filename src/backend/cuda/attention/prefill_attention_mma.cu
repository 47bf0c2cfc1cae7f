// Paged attention for prefill (and mixed / chunked-prefill) steps, register
// resident, FlashAttention-2 style: BF16 q and BF16 pages, head_dim 64 or
// 128, mma.sync m16n8k16 (bf16 in, fp32 accumulate).
//
// Work tile: 64 rows of one sequence and one KV head, row r = (query token
// r / G, query head kv_head * G + r % G), G = hq / hk, so the query heads
// sharing a KV head read each K/V tile once (GQA/MQA). Four warps, each
// owning 16 rows; per warp Q (ldmatrix, once), S = Q K^T, the online-softmax
// state (row max, row sum) and O stay in registers for the whole key loop.
// K/V tiles of 64 keys are gathered through the page table with cp.async
// (16 bytes, zero-filled past the key range) into a double-buffered,
// padded shared-memory ring: tile t+1 loads while tile t computes. A warp
// skips a key tile that none of its rows can see (causal / window / length),
// and masks only tiles that straddle one of its rows' ranges.
// Row r sees keys [max(0, pos - window + 1) if window else 0, min(pos + 1,
// kv_len)), pos = positions[token]: earlier pages (prefix cache, earlier
// chunks) and variable lengths need nothing else. Rows without keys get 0.
#include <cuda_bf16.h>

#include <climits>
#include <cstdint>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace osprey::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kM = 64;  // rows per block
constexpr int kN = 64;  // keys per tile
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr float kLog2e = 1.4426950408889634f;

template <int kHd>
struct MmaLayout {
  static constexpr int kP = kHd + 8;  // bf16 pitch of sQ, sK, sV rows (16-byte pad: conflict-free ldmatrix)
  static constexpr size_t q = 0;      // sQ [kM][kP]; reused to stage the output
  static constexpr size_t k = q + sizeof(bf16) * kM * kP;        // sK [2][kN][kP]
  static constexpr size_t v = k + 2 * sizeof(bf16) * kN * kP;    // sV [2][kN][kP]
  static constexpr size_t range = v + 2 * sizeof(bf16) * kN * kP;  // int [kWarps][2]
  static constexpr size_t bytes = range + sizeof(int) * kWarps * 2;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy; src_bytes == 0 writes zeros.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// c[16x8] += a[16x16] b[16x8], bf16 operands, fp32 accumulators.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

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

template <int kHd>
__global__ void __launch_bounds__(kThreads, 2) prefill_attention_mma_kernel(PagedAttentionArgs a, int tiles_per_seq) {
  using L = MmaLayout<kHd>;
  constexpr int kP = L::kP;
  constexpr int kChunks = kHd / 8;  // 16-byte chunks per row
  constexpr int kDT = kHd / 8;      // n8 tiles of O
  constexpr int kST = kN / 8;       // n8 tiles of S
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem + L::q);
  bf16* sK = reinterpret_cast<bf16*>(smem + L::k);
  bf16* sV = reinterpret_cast<bf16*>(smem + L::v);
  int* sRange = reinterpret_cast<int*>(smem + L::range);

  const int seq = blockIdx.x / tiles_per_seq;
  // Later row tiles see more keys: start them first.
  const int tile = tiles_per_seq - 1 - static_cast<int>(blockIdx.x % tiles_per_seq);
  const int kvh = blockIdx.y;
  const int group = a.hq / a.hk;
  const int q_begin = a.q_indptr[seq];
  const int total_rows = (a.q_indptr[seq + 1] - q_begin) * group;
  const int row0 = tile * kM;
  if (row0 >= total_rows) return;  // uniform over the block
  const int kv_len = a.kv_lens[seq];
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int g = lane >> 2;  // accumulator row within the 8-row half
  const int t4 = lane & 3;  // accumulator column pair

  // q -> sQ (zeros past the sequence's rows).
  const bf16* q = static_cast<const bf16*>(a.q);
  for (int i = tid; i < kM * kChunks; i += kThreads) {
    const int r = i / kChunks;
    const int c = i - r * kChunks;
    const int grow = row0 + r;
    const bf16* src = q;
    int bytes = 0;
    if (grow < total_rows) {
      const int token = q_begin + grow / group;
      const int head = kvh * group + grow % group;
      src = q + (static_cast<int64_t>(token) * a.hq + head) * kHd + c * 8;
      bytes = 16;
    }
    cp_async16(sQ + r * kP + c * 8, src, bytes);
  }
  cp_async_commit();

  // This thread's two rows (g and g + 8 of the warp's 16) and the warp's span.
  int lo0, hi0, lo1, hi1;
  row_range(a, q_begin, group, total_rows, kv_len, row0 + warp * 16 + g, lo0, hi0);
  row_range(a, q_begin, group, total_rows, kv_len, row0 + warp * 16 + g + 8, lo1, hi1);
  int wlo = min(lo0, lo1), whi = max(hi0, hi1);        // union of the warp's ranges
  int wmaxlo = max(lo0, lo1), wminhi = min(hi0, hi1);  // keys every row of the warp sees
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
  cp_async_wait_all();
  __syncthreads();
  int tile_lo = INT_MAX, tile_hi = INT_MIN;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    tile_lo = min(tile_lo, sRange[w * 2]);
    tile_hi = max(tile_hi, sRange[w * 2 + 1]);
  }

  // Q fragments of the warp's 16 rows, all of head_dim.
  uint32_t qf[kHd / 16][4];
#pragma unroll
  for (int kk = 0; kk < kHd / 16; ++kk) {
    const int r = warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8;
    ldmatrix_x4(qf[kk], sQ + r * kP + kk * 16 + (lane >> 4) * 8);
  }

  float o[kDT][4];
#pragma unroll
  for (int i = 0; i < kDT; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY;  // running max (log2 domain, scaled)
  float l0 = 0.0f, l1 = 0.0f;            // this thread's share of the running sums
  const float scale2 = a.scale * kLog2e;

  const int32_t* pages = a.block_indices + a.block_indptr[seq];
  const bf16* kc = static_cast<const bf16*>(a.k_cache);
  const bf16* vc = static_cast<const bf16*>(a.v_cache);
  const int bs = a.block_size;
  const int64_t slot_stride = static_cast<int64_t>(a.hk) * kHd;
  const int64_t head_off = static_cast<int64_t>(kvh) * kHd;

  // Gathers keys [kb, kb + kN) into ring slot buf; keys >= tile_hi are zeros.
  auto load_tile = [&](int kb, int buf) {
    bf16* dk = sK + buf * kN * kP;
    bf16* dv = sV + buf * kN * kP;
#pragma unroll
    for (int n = 0; n < kN * kChunks / kThreads; ++n) {
      const int i = tid + n * kThreads;
      const int j = i / kChunks;
      const int c = i - j * kChunks;
      const int kp = kb + j;
      const bf16* srck = kc;
      const bf16* srcv = vc;
      int bytes = 0;
      if (kp < tile_hi) {
        const int64_t off =
            static_cast<int64_t>(pages[kp / bs] * bs + kp % bs) * slot_stride + head_off + c * 8;
        srck = kc + off;
        srcv = vc + off;
        bytes = 16;
      }
      cp_async16(dk + j * kP + c * 8, srck, bytes);
      cp_async16(dv + j * kP + c * 8, srcv, bytes);
    }
    cp_async_commit();
  };

  if (tile_lo < tile_hi) load_tile(tile_lo, 0);
  int buf = 0;
  for (int kb = tile_lo; kb < tile_hi; kb += kN, buf ^= 1) {
    cp_async_wait_all();
    __syncthreads();  // tile kb landed for all; every warp is done with the other slot
    if (kb + kN < tile_hi) load_tile(kb + kN, buf ^ 1);
    if (kb >= whi || kb + kN <= wlo) continue;  // warp-uniform: no row of this warp sees these keys
    const bf16* tk = sK + buf * kN * kP;
    const bf16* tv = sV + buf * kN * kP;

    // S[16, kN] = Q K^T.
    float s[kST][4];
#pragma unroll
    for (int i = 0; i < kST; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll
    for (int kk = 0; kk < kHd / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < kST / 2; ++np) {
        uint32_t b[4];
        ldmatrix_x4(b, tk + (np * 16 + (lane & 7) + (lane >> 4) * 8) * kP + kk * 16 + ((lane >> 3) & 1) * 8);
        mma_bf16(s[2 * np], qf[kk], b[0], b[1]);
        mma_bf16(s[2 * np + 1], qf[kk], b[2], b[3]);
      }
    }

    // Scale, mask, online softmax.
    const bool full = kb >= wmaxlo && kb + kN <= wminhi;
#pragma unroll
    for (int i = 0; i < kST; ++i) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[i][e] * scale2;
        if (!full) {
          const int col = kb + i * 8 + t4 * 2 + (e & 1);
          const bool ok = e < 2 ? (col >= lo0 && col < hi0) : (col >= lo1 && col < hi1);
          v = ok ? v : -INFINITY;
        }
        s[i][e] = v;
      }
    }
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int i = 0; i < kST; ++i) {
      mx0 = fmaxf(mx0, fmaxf(s[i][0], s[i][1]));
      mx1 = fmaxf(mx1, fmaxf(s[i][2], s[i][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
    // A row with no key so far keeps max -inf: subtract 0 so p = exp2(-inf) = 0.
    const float mu0 = mn0 == -INFINITY ? 0.0f : mn0;
    const float mu1 = mn1 == -INFINITY ? 0.0f : mn1;
    const float alpha0 = exp2f(m0 - mu0), alpha1 = exp2f(m1 - mu1);
    m0 = mn0;
    m1 = mn1;
    float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
    for (int i = 0; i < kST; ++i) {
      s[i][0] = exp2f(s[i][0] - mu0);
      s[i][1] = exp2f(s[i][1] - mu0);
      s[i][2] = exp2f(s[i][2] - mu1);
      s[i][3] = exp2f(s[i][3] - mu1);
      ps0 += s[i][0] + s[i][1];
      ps1 += s[i][2] + s[i][3];
    }
    l0 = l0 * alpha0 + ps0;
    l1 = l1 * alpha1 + ps1;
#pragma unroll
    for (int i = 0; i < kDT; ++i) {
      o[i][0] *= alpha0;
      o[i][1] *= alpha0;
      o[i][2] *= alpha1;
      o[i][3] *= alpha1;
    }

    // O[16, hd] += P[16, kN] V[kN, hd]; P from the S accumulators, rounded to bf16.
#pragma unroll
    for (int kk = 0; kk < kN / 16; ++kk) {
      const uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                              pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                              pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kDT / 2; ++dp) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, tv + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kP + dp * 16 + (lane >> 4) * 8);
        mma_bf16(o[2 * dp], pa, b[0], b[1]);
        mma_bf16(o[2 * dp + 1], pa, b[2], b[3]);
      }
    }
  }

  // out = O / l, staged through the warp's own rows of sQ for 16-byte stores.
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f;
  const float inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
  bf16* stage = sQ + warp * 16 * kP;  // only this warp ever read these rows
#pragma unroll
  for (int i = 0; i < kDT; ++i) {
    *reinterpret_cast<uint32_t*>(stage + g * kP + i * 8 + t4 * 2) = pack_bf16(o[i][0] * inv0, o[i][1] * inv0);
    *reinterpret_cast<uint32_t*>(stage + (g + 8) * kP + i * 8 + t4 * 2) = pack_bf16(o[i][2] * inv1, o[i][3] * inv1);
  }
  __syncwarp();
  bf16* out = static_cast<bf16*>(a.out);
  for (int i = lane; i < 16 * kChunks; i += 32) {
    const int r = i / kChunks;
    const int c = i - r * kChunks;
    const int grow = row0 + warp * 16 + r;
    if (grow >= total_rows) continue;
    const int token = q_begin + grow / group;
    const int head = kvh * group + grow % group;
    *reinterpret_cast<uint4*>(out + (static_cast<int64_t>(token) * a.hq + head) * kHd + c * 8) =
        *reinterpret_cast<const uint4*>(stage + r * kP + c * 8);
  }
}

template <int kHd>
void launch_mma_typed(const PagedAttentionArgs& a, cudaStream_t stream) {
  const int group = a.hq / a.hk;
  const int tiles = (a.max_q_len * group + kM - 1) / kM;
  const int64_t blocks_x = static_cast<int64_t>(a.num_seqs) * tiles;
  OSP_CHECK_LE(blocks_x, int64_t{2147483647});
  constexpr size_t smem = MmaLayout<kHd>::bytes;
  auto kernel = prefill_attention_mma_kernel<kHd>;
  OSP_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const dim3 grid(static_cast<unsigned>(blocks_x), static_cast<unsigned>(a.hk));
  kernel<<<grid, kThreads, smem, stream>>>(a, tiles);
  OSP_CUDA_CHECK_LAUNCH();
}

}  // namespace

// Preconditions: those of prefill_attention_supported (prefill_attention.cu),
// out 16-byte aligned, and at least one query token.
void launch_prefill_attention_mma(const PagedAttentionArgs& a, cudaStream_t stream) {
  if (a.hd == 64) {
    launch_mma_typed<64>(a, stream);
  } else {
    launch_mma_typed<128>(a, stream);
  }
}

}  // namespace osprey::cuda
