// Paged attention for prefill (and mixed) steps: 16-bit q, out and pages of
// one type T (BF16 or F16), head_dim 64 or 128. launch_prefill_attention
// runs the Hopper wgmma kernel (prefill_wgmma.cu) where it applies (sm_90
// device, head_dim 128, no window), else the register-resident mma.sync
// kernel (prefill_attention_mma.cu);
// this file keeps the earlier wmma kernel, below, as the fallback for an
// unaligned out or a scale <= 0 and as the benchmark baseline:
//
// Work tile: 64 rows of one sequence and one KV head, row r = (query token
// r / G, query head kv_head * G + r % G), G = hq / hk, so the query heads
// sharing a KV head read each K/V tile once (GQA/MQA). Four warps, each
// owning 16 rows. Per tile of 64 keys (gathered from the pages with 16-byte
// loads into shared memory):
//   S = Q K^T       wmma 16x16x16 on T, fp32 accumulate -> shared memory
//   softmax         two lanes per row: causal/window/length mask, running
//                   max and sum in fp32, P rounded to T, O rows rescaled
//   O += P V        wmma with O kept in shared memory (fp32)
// Rows are causal by position, so earlier pages (prefix cache, earlier
// chunks) and variable lengths in one batch come for free.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/attention/prefill_attention_mma.h"
#include "backend/cuda/attention/prefill_rows.cuh"
#include "backend/cuda/attention/prefill_wgmma.h"
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/device_common.cuh"
#include "backend/cuda/device_query.h"
#include "backend/cuda/host_util.h"
#include "backend/cuda/kernels.h"

namespace osprey::cuda {

namespace {

using namespace nvcuda;

constexpr int kM = 64;  // rows per block
constexpr int kN = 64;  // keys per tile
constexpr int kThreads = 128;

template <int kHd>
struct Layout {
  static constexpr int kQP = kHd + 8;  // element pitch of sQ, sK, sV
  static constexpr int kSP = kN + 4;   // fp32 pitch of sS
  static constexpr int kPP = kN + 8;   // element pitch of sP
  static constexpr int kOP = kHd + 4;  // fp32 pitch of sO
  static constexpr size_t q = 0;
  static constexpr size_t k = q + sizeof(uint16_t) * kM * kQP;
  static constexpr size_t v = k + sizeof(uint16_t) * kN * kQP;
  static constexpr size_t s = v + sizeof(uint16_t) * kN * kQP;
  static constexpr size_t p = s + sizeof(float) * kM * kSP;
  static constexpr size_t o = p + sizeof(uint16_t) * kM * kPP;
  static constexpr size_t m = o + sizeof(float) * kM * kOP;
  static constexpr size_t l = m + sizeof(float) * kM;
  static constexpr size_t lo = l + sizeof(float) * kM;
  static constexpr size_t hi = lo + sizeof(int) * kM;
  static constexpr size_t slot = hi + sizeof(int) * kM;
  static constexpr size_t bytes = slot + sizeof(int) * kN;
  static_assert(k % 32 == 0 && v % 32 == 0 && s % 32 == 0 && p % 32 == 0 && o % 32 == 0, "wmma alignment");
};

template <class T, int kHd>
__global__ void __launch_bounds__(kThreads) prefill_attention_kernel(PagedAttentionArgs a, int tiles_per_seq) {
  using L = Layout<kHd>;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sQ = reinterpret_cast<T*>(smem + L::q);
  T* sK = reinterpret_cast<T*>(smem + L::k);
  T* sV = reinterpret_cast<T*>(smem + L::v);
  float* sS = reinterpret_cast<float*>(smem + L::s);
  T* sP = reinterpret_cast<T*>(smem + L::p);
  float* sO = reinterpret_cast<float*>(smem + L::o);
  float* sM = reinterpret_cast<float*>(smem + L::m);
  float* sL = reinterpret_cast<float*>(smem + L::l);
  int* sLo = reinterpret_cast<int*>(smem + L::lo);
  int* sHi = reinterpret_cast<int*>(smem + L::hi);
  int* sSlot = reinterpret_cast<int*>(smem + L::slot);

  const int seq = blockIdx.x / tiles_per_seq;
  const int tile = blockIdx.x % tiles_per_seq;
  const int kvh = blockIdx.y;
  const PrefillRows rows = prefill_rows(a, seq, tile, kM);
  const auto [group, q_begin, total_rows, row0] = rows;
  if (row0 >= total_rows) return;  // uniform over the block
  const int kv_len = a.kv_lens[seq];
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  constexpr int kChunks = kHd / 8;  // 16-byte chunks per row

  // Rows: key ranges, running state, q.
  for (int r = tid; r < kM; r += kThreads) {
    const int grow = row0 + r;
    int lo = INT_MAX, hi = INT_MIN;
    if (grow < total_rows) {
      const int pos = a.positions[q_begin + grow / group];
      hi = min(pos + 1, kv_len);
      lo = a.window > 0 ? max(0, pos - a.window + 1) : 0;
      if (hi <= lo) {
        lo = INT_MAX;
        hi = INT_MIN;
      }
    }
    sLo[r] = lo;
    sHi[r] = hi;
    sM[r] = -INFINITY;
    sL[r] = 0.0f;
  }
  for (int i = tid; i < kM * kChunks; i += kThreads) {
    const int r = i / kChunks;
    const int c = i - r * kChunks;
    const T* src = prefill_q_chunk<T, kHd>(a, rows, kvh, r, c);
    *reinterpret_cast<uint4*>(sQ + r * L::kQP + c * 8) =
        src != nullptr ? *reinterpret_cast<const uint4*>(src) : make_uint4(0, 0, 0, 0);
  }
  for (int i = tid; i < kM * kHd; i += kThreads) sO[(i / kHd) * L::kOP + i % kHd] = 0.0f;
  __syncthreads();
  int tile_lo = INT_MAX, tile_hi = INT_MIN;
  for (int r = 0; r < kM; ++r) {
    tile_lo = min(tile_lo, sLo[r]);
    tile_hi = max(tile_hi, sHi[r]);
  }

  const int32_t* pages = a.block_indices + a.block_indptr[seq];
  const T* kc = static_cast<const T*>(a.k_cache);
  const T* vc = static_cast<const T*>(a.v_cache);
  const int bs = a.block_size;
  const int64_t slot_stride = static_cast<int64_t>(a.hk) * kHd;
  const int my_row = warp * 16 + (lane >> 1);  // softmax: two lanes per row
  const int half = lane & 1;

  for (int kb = tile_lo; kb < tile_hi; kb += kN) {
    __syncthreads();  // previous tile's sK / sV / sSlot no longer read
    if (tid < kN) {
      const int kp = kb + tid;
      sSlot[tid] = kp < tile_hi ? pages[kp / bs] * bs + kp % bs : -1;
    }
    __syncthreads();
    for (int i = tid; i < kN * kChunks; i += kThreads) {
      const int j = i / kChunks;
      const int c = i - j * kChunks;
      const int slot = sSlot[j];
      uint4 kv4 = make_uint4(0, 0, 0, 0), vv4 = make_uint4(0, 0, 0, 0);
      if (slot >= 0) {
        const int64_t off = static_cast<int64_t>(slot) * slot_stride + static_cast<int64_t>(kvh) * kHd + c * 8;
        kv4 = *reinterpret_cast<const uint4*>(kc + off);
        vv4 = *reinterpret_cast<const uint4*>(vc + off);
      }
      *reinterpret_cast<uint4*>(sK + j * L::kQP + c * 8) = kv4;
      *reinterpret_cast<uint4*>(sV + j * L::kQP + c * 8) = vv4;
    }
    __syncthreads();

    // S[16 rows of this warp, 64 keys] = Q K^T.
#pragma unroll
    for (int nk = 0; nk < kN / 16; ++nk) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int kk = 0; kk < kHd / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> fb;
        wmma::load_matrix_sync(fa, sQ + warp * 16 * L::kQP + kk * 16, L::kQP);
        wmma::load_matrix_sync(fb, sK + nk * 16 * L::kQP + kk * 16, L::kQP);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(sS + warp * 16 * L::kSP + nk * 16, acc, L::kSP, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax of this warp's rows; lane pair (row, half) owns 32 columns.
    {
      const int lo = sLo[my_row], hi = sHi[my_row];
      float sc[kN / 2];
      float tmax = -INFINITY;
#pragma unroll
      for (int j = 0; j < kN / 2; ++j) {
        const int col = half * (kN / 2) + j;
        const int kp = kb + col;
        const float v = sS[my_row * L::kSP + col] * a.scale;
        sc[j] = kp >= lo && kp < hi ? v : -INFINITY;
        tmax = fmaxf(tmax, sc[j]);
      }
      tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));
      const float m_old = sM[my_row];
      const float m_new = fmaxf(m_old, tmax);
      float alpha = 1.0f, psum = 0.0f;
      if (m_new != -INFINITY) {
        alpha = expf(m_old - m_new);
#pragma unroll
        for (int j = 0; j < kN / 2; ++j) {
          const float p = expf(sc[j] - m_new);
          psum += p;
          sP[my_row * L::kPP + half * (kN / 2) + j] = from_float<T>(p);
        }
      } else {
#pragma unroll
        for (int j = 0; j < kN / 2; ++j) sP[my_row * L::kPP + half * (kN / 2) + j] = from_float<T>(0.0f);
      }
      psum += __shfl_xor_sync(0xffffffffu, psum, 1);
      const float l_old = sL[my_row];
      __syncwarp();  // both lanes of the pair have read sM / sL
      if (half == 0) {
        sM[my_row] = m_new;
        sL[my_row] = l_old * alpha + psum;
      }
      if (alpha != 1.0f) {
        float* orow = sO + my_row * L::kOP + half * (kHd / 2);
#pragma unroll 8
        for (int d = 0; d < kHd / 2; ++d) orow[d] *= alpha;
      }
    }
    __syncwarp();

    // O[16 rows, hd] += P[16, 64] V[64, hd].
#pragma unroll
    for (int nd = 0; nd < kHd / 16; ++nd) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      float* optr = sO + warp * 16 * L::kOP + nd * 16;
      wmma::load_matrix_sync(acc, optr, L::kOP, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < kN / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> fa;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> fb;
        wmma::load_matrix_sync(fa, sP + warp * 16 * L::kPP + kk * 16, L::kPP);
        wmma::load_matrix_sync(fb, sV + kk * 16 * L::kQP + nd * 16, L::kQP);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(optr, acc, L::kOP, wmma::mem_row_major);
    }
  }
  __syncthreads();

  // out = O / l (zero rows without keys).
  T* out = static_cast<T*>(a.out);
  for (int i = tid; i < kM * kHd; i += kThreads) {
    const int r = i / kHd;
    const int d = i - r * kHd;
    const int64_t off = prefill_row_offset<kHd>(a, rows, kvh, r);
    if (off < 0) continue;
    const float l = sL[r];
    out[off + d] = from_float<T>(l > 0.0f ? sO[r * L::kOP + d] / l : 0.0f);
  }
}

template <class T, int kHd>
void launch_typed(const PagedAttentionArgs& a, cudaStream_t stream) {
  const int group = a.hq / a.hk;
  const int tiles = (a.max_q_len * group + kM - 1) / kM;
  const int64_t blocks_x = static_cast<int64_t>(a.num_seqs) * tiles;
  OSP_CHECK_LE(blocks_x, int64_t{2147483647});
  constexpr size_t smem = Layout<kHd>::bytes;
  auto kernel = prefill_attention_kernel<T, kHd>;
  set_max_dynamic_smem_once(kernel, smem);
  const dim3 grid(static_cast<unsigned>(blocks_x), static_cast<unsigned>(a.hk));
  kernel<<<grid, kThreads, smem, stream>>>(a, tiles);
  OSP_CUDA_CHECK_LAUNCH();
}

}  // namespace

// F8_E4M3 pages: the mma.sync kernel only (its F8 variant), which needs an
// aligned out and a positive scale.
bool prefill_attention_supported(const PagedAttentionArgs& a) {
  // One-byte pages take the mma.sync kernel (staged and widened), which needs these two.
  const bool mma_kernel = aligned16(a.out) && a.scale > 0.0f;
  const bool pages_ok = a.kv_dtype == a.act || (a.kv_dtype == DType::kF8E4M3 && mma_kernel) ||
                        (a.kv_dtype == DType::kI8 && mma_kernel && a.k_row_scales && a.v_row_scales);
  return (a.act == DType::kBF16 || a.act == DType::kF16) && pages_ok && (a.hd == 64 || a.hd == 128) &&
         a.hk > 0 && a.hq % a.hk == 0 && a.num_splits == 1 && aligned16(a.q) && aligned16(a.k_cache) &&
         aligned16(a.v_cache);
}

void launch_prefill_attention_wmma(const PagedAttentionArgs& a, cudaStream_t stream) {
  OSP_CHECK(prefill_attention_supported(a) && a.kv_dtype == a.act);
  if (a.num_tokens == 0 || a.num_seqs == 0 || a.max_q_len == 0) return;
  if (a.act == DType::kF16) {
    if (a.hd == 64) {
      launch_typed<__half, 64>(a, stream);
    } else {
      launch_typed<__half, 128>(a, stream);
    }
  } else if (a.hd == 64) {
    launch_typed<__nv_bfloat16, 64>(a, stream);
  } else {
    launch_typed<__nv_bfloat16, 128>(a, stream);
  }
}

void launch_prefill_attention(const PagedAttentionArgs& a, cudaStream_t stream) {
  OSP_CHECK(prefill_attention_supported(a));
  if (a.num_tokens == 0 || a.num_seqs == 0 || a.max_q_len == 0) return;
  if (aligned16(a.out) && a.scale > 0.0f) {  // the mma kernel folds a positive scale into its exponent
    // OSPREY_PREFILL_ORDER=per_head: the earlier block order, for an A/B.
    static const PrefillOrder order =
        env_equals("OSPREY_PREFILL_ORDER", "per_head") ? PrefillOrder::kPerHead : PrefillOrder::kLongestFirst;
    // OSPREY_PREFILL_WGMMA=0: the mma.sync kernel on Hopper too, for an A/B;
    // =1..4: that variant of the wgmma kernel (prefill_wgmma.h; default 3).
    static const int wgmma_variant = [] {
      const int64_t v = env_int("OSPREY_PREFILL_WGMMA", 0, kNumPrefillWgmmaVariants - 1, -1);
      return v == 0 ? -1 : v < 0 ? 0 : static_cast<int>(v);  // unset or invalid: the default variant
    }();
    // Steps of mostly single-token rows (serving's decodes riding along a
    // prompt chunk) stay on the mma.sync kernel, whose block shapes are
    // chosen for them: the wgmma kernel's 128-row tiles were measured on
    // prompts only. The step must average >= 32 query tokens per sequence
    // (one full tile per KV head at G = 4).
    const bool prompt_heavy = int64_t{a.num_tokens} >= 32 * int64_t{a.num_seqs};
    if (wgmma_variant >= 0 && prompt_heavy && prefill_wgmma_supports(a, wgmma_variant) && prefill_wgmma_available()) {
      launch_prefill_attention_wgmma(a, stream, wgmma_variant);
    } else {
      launch_prefill_attention_mma(a, stream, 0, order);
    }
  } else {
    launch_prefill_attention_wmma(a, stream);
  }
}

}  // namespace osprey::cuda
