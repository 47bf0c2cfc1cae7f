// Host-side launchers of the CUDA kernels, one group per .cu file. Plain C++
// declarations so cuda_backend.cpp needs no device code. Every pointer is
// device memory; every launcher enqueues on `stream` and checks the launch.
// Shapes are in the comments.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"

namespace osprey::cuda {

// Activations ("act" dtype) are F32, BF16 or F16 row-major; their pointers are
// void* of that dtype. Norm weights, biases and RoPE tables are fp32.

// ---- elementwise/ ----------------------------------------------------------------

// out[i, :] = dequant(table row ids[i]) for i < n; table [vocab, d] of any
// weight dtype with rows row_bytes apart. Ids outside [0, vocab) give a zero row.
void launch_embedding(DType dtype, const void* table, int64_t row_bytes, int64_t vocab, int64_t d, const int32_t* ids,
                      int64_t n, DType out_dtype, void* out, cudaStream_t stream);

// x[i] += y[i] for i < count.
void launch_add(DType act, void* x, const void* y, int64_t count, cudaStream_t stream);

// out[n, f] = silu(gate_up[n, :f]) * gate_up[n, f:]. inv [n] fp32 or null:
// row t's gate and up values first multiplied by inv[t] and rounded to act
// (as launch_rms_scaled_silu_mul, with the row factors computed before).
void launch_silu_mul(DType act, const void* gate_up, int64_t n, int64_t f, void* out, cudaStream_t stream,
                     const float* inv = nullptr);

// launch_silu_mul of gate_up with row t first scaled by inv_t = 1 /
// sqrt(mean(x[t, :]^2) + x_eps): g = gate_up[t, j] * inv_t and u =
// gate_up[t, f + j] * inv_t each rounded to act, out[t, j] = silu(g) * u
// rounded once. x [n, d] of act. Blocks (chunk of columns, row), one column
// group a thread: each reduces its row of x, then its chunk; the grid
// depends on n and f only. For decode-size steps, n <= 65535 (the backend
// computes the factors in a pass of their own above kRowScalePassRows rows).
void launch_rms_scaled_silu_mul(DType act, const void* x, int64_t d, float x_eps, const void* gate_up, int64_t n,
                                int64_t f, void* out, cudaStream_t stream);

// w[r, i] = w[r, i] * scale[i] rounded to dtype (F32, F16 or BF16), in place,
// for count elements of rows of k columns (count % k == 0); scale [k] fp32.
void launch_scale_columns(DType dtype, void* w, int64_t count, int64_t k, const float* scale, cudaStream_t stream);

// out row r = x row rows[r] (row_bytes each) for r < num_rows; indices
// outside [0, num_x_rows) give a zero row.
void launch_gather_rows(const void* x, int64_t row_bytes, int64_t num_x_rows, const int32_t* rows, int num_rows,
                        void* out, cudaStream_t stream);

// out row r = x row src_rows[r] (row_bytes each) for r < num_rows where
// src_rows[r] is in [0, num_x_rows); other rows are not written. x and out
// must not overlap. Grid: num_rows blocks, however many rows are filled.
void launch_fill_rows_from(const void* x, int64_t row_bytes, int64_t num_x_rows, const int32_t* src_rows,
                           int num_rows, void* out, cudaStream_t stream);

// out[n, m] (leading dimension ldo, dtype out_dtype) = bias[m] broadcast over rows.
void launch_fill_rows(const float* bias, int64_t n, int64_t m, DType out_dtype, void* out, int64_t ldo,
                      cudaStream_t stream);

// dst[i] = convert(src[i]) between F32, F16 and BF16 (round to nearest even), i < count.
void launch_convert(DType from, const void* src, int64_t count, DType to, void* dst, cudaStream_t stream);
// Kept for the matmul's fp32-activation path: F32 -> F16/BF16.
inline void launch_convert_f32(const float* src, int64_t count, DType to, void* dst, cudaStream_t stream) {
  launch_convert(DType::kF32, src, count, to, dst, stream);
}

// dst[i] = lo + (hi - lo) * ops::uniform_hash01(seed, i) in dtype (F32/F16/BF16).
void launch_fill_uniform(DType dtype, void* dst, int64_t count, uint64_t seed, float lo, float hi,
                         cudaStream_t stream);

// ---- norm/ -----------------------------------------------------------------------

// out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w for r < rows; w [d].
// out may alias x (head_rms_norm runs in place with rows = n * heads).
void launch_rms_norm(DType act, const void* x, const float* w, float eps, int64_t rows, int64_t d, void* out,
                     cudaStream_t stream);

// residual[r, :] += x[r, :]; out[r, :] = rms_norm(residual[r, :]) * w
// (the sum is rounded to act before the norm reads it).
void launch_add_rms_norm(DType act, void* residual, const void* x, const float* w, float eps, int64_t rows, int64_t d,
                         void* out, cudaStream_t stream);

// inv[r] = 1 / sqrt(mean(x[r, :]^2) + eps) (fp32) for r < rows; x [rows, d] of
// act. The per-row factor of a norm folded into the projection after it, for
// steps with too many rows for each reading block to reduce its row itself
// (cuda_backend.cpp, kRowScalePassRows).
void launch_row_inv_rms(DType act, const void* x, int64_t rows, int64_t d, float eps, float* inv, cudaStream_t stream);

// ---- rope/ -----------------------------------------------------------------------

// In place, Hugging Face half rotation of the first rotary_dim dims of every
// head: q [n, hq, hd], k [n, hk, hd]; angle = positions[t] * inv_freq[i] in fp32.
void launch_rope(DType act, void* q, void* k, const int32_t* positions, int64_t n, int hq, int hk, int hd,
                 const float* inv_freq, int rotary_dim, float attention_scaling, cudaStream_t stream);

// The fused attention input: qkv [n, (hq + 2 hk) * hd] of act; per head
// optional RMSNorm (q_norm/k_norm [hd] or null), RoPE of q and k, q_out
// [n, hq, hd] of act, K/V rows into the pages (cache_dtype) at
// slot_mapping (-1 or >= num_slots skips). rms_x set: every q/k/v value of
// token t is first multiplied by inv_t = 1 / sqrt(mean(rms_x[t, :]^2) +
// rms_eps) and rounded to act (the qkv projection of rms_norm(x) with the
// norm weight folded into it); rms_x [n, rms_d] of act. Null: no scaling.
struct QkvRopeArgs {
  DType act = DType::kF32;
  const void* qkv = nullptr;
  void* q_out = nullptr;
  int64_t n = 0;
  int hq = 0, hk = 0, hd = 0;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  float eps = 0.0f;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  int rotary_dim = 0;
  float attention_scaling = 1.0f;
  const int32_t* slot_mapping = nullptr;
  DType cache_dtype = DType::kF32;
  void* k_cache = nullptr;
  void* v_cache = nullptr;
  // F8_E4M3 pages: 1 / the layer's K and V scales (attention/kv_fp8.cuh).
  float k_inv_scale = 1.0f, v_inv_scale = 1.0f;
  // I8 pages: the row scales (ops::LayerKv, at ops::kv_row_scale_index with
  // pages of block_size slots), one written per (slot, KV head) row.
  float* k_row_scales = nullptr;
  float* v_row_scales = nullptr;
  int block_size = 0;
  int64_t num_slots = 0;
  const void* rms_x = nullptr;
  int64_t rms_d = 0;
  float rms_eps = 0.0f;
  // The row factors computed before (launch_row_inv_rms), [n] fp32: used
  // instead of reducing rms_x (which is then ignored); null: none.
  const float* rms_inv = nullptr;
  // With the row scale: [(hq + 2 hk) * hd] fp32 added to each scaled value
  // before its rounding, fmaf(v, inv, bias) (the projection's bias, which
  // the scale must not touch); null: none.
  const float* qkv_bias = nullptr;
};
void launch_qkv_rope_kv_write(const QkvRopeArgs& args, cudaStream_t stream);

// ---- gemm/ -----------------------------------------------------------------------

// FP8 (gemm/fp8.cu): q[count] = E4M3 of x * (448 / amax) with amax = max |x|
// over all count elements of x (F32, F16 or BF16), rounded to nearest even
// and saturated; *scale_out = amax / 448 (1 and 1 when x is all zeros; +inf
// when x holds a non-finite value). partials: fp8_amax_parts(count) floats of
// scratch. Two kernels (launch_pdl), graph-safe.
int fp8_amax_parts(int64_t count);
void launch_fp8_quantize(DType t, const void* x, int64_t count, float* partials, uint8_t* q, float* scale_out,
                         cudaStream_t stream);
// One activation row on E4M3 weights (gemm/gemv.cu): out[j] = s * dot(x,
// e4m3(w row j)) (+ bias[j]) (+ out[j] when accumulate) for j < m, s =
// *w_scale, x [k] and out [m] both of x_dtype (BF16 or F16; x not
// quantised), fp32 dot, one rounding. w [m, k] rows k bytes apart, 16-byte
// aligned, k % 16 == 0. false (nothing launched) where that does not hold
// or OSPREY_FP8_GEMV=0 (read once; cuBLASLt's FP8 GEMM on the quantised row
// then). launch_pdl.
bool launch_gemv_fp8(const void* w, int64_t m, int64_t k, const float* w_scale, DType x_dtype, const void* x,
                     const float* bias, void* out, bool accumulate, cudaStream_t stream);

// Rows handled per GEMV pass: larger n runs in passes of this many rows.
constexpr int kGemvRowsPerPass = 8;

// out[i, j] = dot(x[i, :], dequant(w row j)) (+ bias[j]) (+ out[i, j] when
// accumulate) for i < n, j < m, in fp32 accumulation; x of x_dtype
// (F32/BF16/F16), out of out_dtype (F32 or x_dtype) with leading dimension
// m. w rows are row_bytes apart; k % 32 == 0 for the quantised dtypes. bias
// may be null. accumulate: out is read (after the PDL wait) and the fp32 sum
// (dot + bias) + out rounded once to out_dtype; x must not overlap out.
// num_sms: the device's multiprocessor count (the batch-1 quantised GEMV's
// persistent grid).
void launch_gemv(DType dtype, const void* w, int64_t row_bytes, int64_t m, int64_t k, DType x_dtype, const void* x,
                 int64_t n, const float* bias, DType out_dtype, void* out, int num_sms, cudaStream_t stream,
                 bool accumulate = false);

// One activation row with the SiLU-and-mul folded in: out[j] = silu(g[j]) *
// u[j] for j < f, where g[j] = dot(x, w row j) and u[j] = dot(x, w row f + j),
// each rounded to act first (bit for bit launch_gemv then launch_silu_mul).
// w [2 f, k] of w_dtype (BF16 or F16, 16-byte aligned rows, k % 8 == 0), x [k]
// and out [f] of act (BF16 or F16); false (nothing launched) where a dtype
// or alignment does not fit or OSPREY_FUSED_SILU=0 is set (read once).
bool launch_gemv_silu_mul(DType w_dtype, const void* w, int64_t row_bytes, int64_t f, int64_t k, DType act,
                          const void* x, void* out, cudaStream_t stream);

// The RMSNorm of x folded into launch_gemv: out[i, j] = dot(xn[i, :], w row
// j) (+ bias[j]), xn[i, c] = x[i, c] * inv_i * g[c] rounded to act (as
// launch_rms_norm writes it), inv_i = 1 / sqrt(mean(x[i, :]^2) + eps), for
// i < n, j < m. Each block stages xn of its rows once in shared memory
// (n * k * 2 bytes a pass of kGemvRowsPerPass rows) and loops over tiles of
// weight rows (persistent grid); no normed row goes to global memory. At
// k <= 4096 bit for bit launch_rms_norm then launch_gemv. w [m, k] of
// w_dtype (BF16 or F16, 16-byte aligned rows; or F8_E4M3 at n = 1 with its
// scale at fp8_scale_offset(m, k), k % 16 == 0: bit for bit launch_rms_norm
// then launch_gemv_fp8, and declined where that is), x [n, k] and out [n, m] of
// act (BF16 or F16), g [k] F32, bias [m] F32 or null; x, g 16-byte aligned,
// k % 8 == 0. False (nothing launched) where a dtype or alignment does not
// fit or a pass's staged rows exceed the device's shared memory per block.
// PDL as launch_gemv (g is read after the wait, like x). Meant for n <= a
// few passes of kGemvRowsPerPass: each pass re-reads w. num_sms: the
// device's SM count (the persistent grid's size).
bool launch_gemv_rms_norm(DType w_dtype, const void* w, int64_t row_bytes, int64_t m, int64_t k, DType act,
                          const void* x, int64_t n, const float* g, float eps, const float* bias, void* out,
                          int num_sms, cudaStream_t stream);

// launch_gemv_silu_mul with x RMS-normed first (as launch_gemv_rms_norm,
// one row staged per block): out[j] = silu(gate_j) * up_j, gate_j / up_j =
// dot(xn, w row) rounded to act. Same operand rules as both (F8_E4M3 w:
// the scale at fp8_scale_offset(2 f, k), gate_j / up_j = s * dot rounded
// to act, as launch_gemv_fp8 writes them); false (nothing launched) where
// they do not fit or OSPREY_FUSED_SILU=0.
bool launch_gemv_rms_norm_silu_mul(DType w_dtype, const void* w, int64_t row_bytes, int64_t f, int64_t k, DType act,
                                   const void* x, const float* g, float eps, void* out, int num_sms,
                                   cudaStream_t stream);

// dst[r, :] = dequant(w row r) as out_dtype (F32, BF16 or F16), r < rows (dst
// leading dimension k).
void launch_dequant_rows(DType dtype, const void* w, int64_t row_bytes, int64_t rows, int64_t k, DType out_dtype,
                         void* dst, cudaStream_t stream);
inline void launch_dequant_rows(DType dtype, const void* w, int64_t row_bytes, int64_t rows, int64_t k, float* dst,
                                cudaStream_t stream) {
  launch_dequant_rows(dtype, w, row_bytes, rows, k, DType::kF32, dst, stream);
}

// ---- attention/ ------------------------------------------------------------------

// Writes k, v [n, hk, hd] (act dtype) into the pages at slot_mapping[t] (page *
// block_size + row, -1 skips; slots >= num_slots are skipped). Caches are
// [num_slots, hk, hd] of cache_dtype (F32, F16, BF16, or F8_E4M3 storing
// k * k_inv_scale and v * v_inv_scale, or I8 storing each (slot, head) row
// of hd values as int8_row_quantize does, its scale in k_row_scales /
// v_row_scales at ops::kv_row_scale_index with pages of block_size slots:
// attention/kv_fp8.cuh).
void launch_kv_write(DType act, const void* k, const void* v, const int32_t* slot_mapping, int64_t n, int hk, int hd,
                     DType cache_dtype, void* k_cache, void* v_cache, int64_t num_slots, float k_inv_scale,
                     float v_inv_scale, float* k_row_scales, float* v_row_scales, int block_size,
                     cudaStream_t stream);

struct PagedAttentionArgs {
  DType act = DType::kF32;        // dtype of q and out (F32, BF16 or F16)
  const void* q = nullptr;        // [num_tokens, hq, hd]
  const void* k_cache = nullptr;  // [num_blocks, block_size, hk, hd] of kv_dtype
  const void* v_cache = nullptr;
  DType kv_dtype = DType::kF32;          // F32, F16, BF16, F8_E4M3 or I8
  float k_scale = 1.0f, v_scale = 1.0f;  // F8_E4M3 pages: value = e4m3 * scale (attention/kv_fp8.cuh)
  // I8 pages: value = q * the row's scale, at ops::kv_row_scale_index (ops::LayerKv).
  const float* k_row_scales = nullptr;
  const float* v_row_scales = nullptr;
  int num_blocks = 0;
  int block_size = 0;
  int hq = 0, hk = 0, hd = 0;
  int num_seqs = 0, num_tokens = 0, max_q_len = 0, max_kv_len = 0;
  // A sub-batch's first token (a mixed step's prompt part after its leading
  // decodes): q_indptr and positions stay absolute, so q and out hold
  // token_offset + num_tokens rows (the wgmma kernel's Q tensor map spans them).
  int token_offset = 0;
  const int32_t* q_indptr = nullptr;       // [num_seqs + 1], from token_offset
  const int32_t* kv_lens = nullptr;        // [num_seqs]
  const int32_t* block_indptr = nullptr;   // [num_seqs + 1]
  const int32_t* block_indices = nullptr;  // [block_indptr[num_seqs]]
  const int32_t* positions = nullptr;      // [num_tokens]
  float scale = 1.0f;
  int window = 0;        // 0: unlimited
  void* out = nullptr;   // [num_tokens, hq, hd] of act
  // Split along the KV sequence: num_splits > 1 needs partial buffers
  // part_acc [num_splits, num_tokens, hq, hd] and part_ml [num_splits, num_tokens, hq, 2].
  int num_splits = 1;
  // Each split takes at least this many keys (rounded up to the kernel's key
  // tile); splits past a sequence's range are empty. Lets a decode step fix
  // num_splits without knowing the step's lengths (graph contract).
  int min_keys_per_split = 0;
  float* part_acc = nullptr;
  float* part_ml = nullptr;
  // Decode kernel only (tensor-core path, num_splits > 1): one counter per
  // (sequence, KV head, part of its query heads), decode_blocks_per_split
  // of them (num_seqs * hk where G <= 8), zero before the launch and
  // left zero after it; the kernel then merges the splits itself (the last
  // block of each pair to finish) and no combine kernel runs. Null: the
  // combine kernel merges (launch_decode_attention decides).
  unsigned int* split_tickets = nullptr;
  // Decode kernel only (tensor-core path): a permutation of [0, num_seqs),
  // most keys first (AttentionBatch::decode_order), or null. The blocks of
  // seq_order[0] are scheduled first, then seq_order[1]'s, and so on.
  const int32_t* seq_order = nullptr;
};

// Largest head_dim the attention kernels take.
constexpr int kMaxHeadDim = 256;

// Rows (token x query head of one KV head) per attention work tile, and the
// number of such tiles along one sequence's queries.
constexpr int kAttnTileRows = 16;
inline int attention_tiles_per_seq(int max_q_len, int group) {
  return (max_q_len * group + kAttnTileRows - 1) / kAttnTileRows;
}

void launch_paged_attention(const PagedAttentionArgs& args, cudaStream_t stream);

// out = merge of the num_splits partials (part_acc, part_ml) into args.out.
void launch_combine_splits(const PagedAttentionArgs& args, cudaStream_t stream);

// Decode steps (num_tokens == num_seqs, one query token each): the
// GQA-aware split-KV kernels of attention/decode_attention.cu. Supported for
// head_dim 64/128 with 16-byte aligned pages and, on the tensor-core kernel
// (BF16/F16 q with pages of that dtype, F8_E4M3 or I8), any G = hq / hk;
// on the SIMT kernel (F32 q, or OSPREY_DECODE_ATTENTION=simt) G in
// {1, 2, 4, 8}; otherwise use launch_paged_attention.
bool decode_attention_supported(const PagedAttentionArgs& args);
// The decode kernel's blocks per split: num_seqs * hk, times ceil(G / 8) on
// the tensor-core kernel; its in-kernel split merge takes one counter each.
int64_t decode_blocks_per_split(const PagedAttentionArgs& args);
// Sets args.num_splits and args.min_keys_per_split for the decode kernel
// launch_decode_attention will pick, from num_seqs, the shapes and dtypes and
// the device's SM count only (graph contract).
void plan_decode_splits(PagedAttentionArgs& args, int num_sms);

// Prefill and mixed steps on tensor cores (attention/prefill_attention.cu):
// BF16 or F16 q/out with pages of the same dtype, head_dim 64/128,
// num_splits == 1; otherwise use launch_paged_attention.
bool prefill_attention_supported(const PagedAttentionArgs& args);
void launch_prefill_attention(const PagedAttentionArgs& args, cudaStream_t stream);
void launch_decode_attention(const PagedAttentionArgs& args, cudaStream_t stream);

}  // namespace osprey::cuda
