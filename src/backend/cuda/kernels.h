// Host-side launchers of the CUDA kernels, one group per .cu file. Plain C++
// declarations so cuda_backend.cpp needs no device code. Every pointer is
// device memory; every launcher enqueues on `stream` and checks the launch.
// Activations are fp32 row-major; shapes are in the comments.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"

namespace osprey::cuda {

// ---- elementwise/ ----------------------------------------------------------------

// out[i, :] = dequant(table row ids[i]) for i < n; table [vocab, d] of any
// weight dtype with rows row_bytes apart. Ids outside [0, vocab) give a zero row.
void launch_embedding(DType dtype, const void* table, int64_t row_bytes, int64_t vocab, int64_t d, const int32_t* ids,
                      int64_t n, float* out, cudaStream_t stream);

// x[i] += y[i] for i < count.
void launch_add(float* x, const float* y, int64_t count, cudaStream_t stream);

// out[n, f] = silu(gate_up[n, :f]) * gate_up[n, f:].
void launch_silu_mul(const float* gate_up, int64_t n, int64_t f, float* out, cudaStream_t stream);

// out row r = x row rows[r] (row_bytes each) for r < num_rows; indices
// outside [0, num_x_rows) give a zero row.
void launch_gather_rows(const void* x, int64_t row_bytes, int64_t num_x_rows, const int32_t* rows, int num_rows,
                        void* out, cudaStream_t stream);

// out[n, m] = bias[m] broadcast over rows.
void launch_fill_rows(const float* bias, int64_t n, int64_t m, float* out, cudaStream_t stream);

// dst[i] = convert(src[i]) to F16 or BF16 (round to nearest even), i < count.
void launch_convert_f32(const float* src, int64_t count, DType to, void* dst, cudaStream_t stream);

// ---- norm/ -----------------------------------------------------------------------

// out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w for r < rows; w [d].
// out may alias x (head_rms_norm runs in place with rows = n * heads).
void launch_rms_norm(const float* x, const float* w, float eps, int64_t rows, int64_t d, float* out,
                     cudaStream_t stream);

// residual[r, :] += x[r, :]; out[r, :] = rms_norm(residual[r, :]) * w.
void launch_add_rms_norm(float* residual, const float* x, const float* w, float eps, int64_t rows, int64_t d,
                         float* out, cudaStream_t stream);

// ---- rope/ -----------------------------------------------------------------------

// In place, Hugging Face half rotation of the first rotary_dim dims of every
// head: q [n, hq, hd], k [n, hk, hd]; angle = positions[t] * inv_freq[i] in fp32.
void launch_rope(float* q, float* k, const int32_t* positions, int64_t n, int hq, int hk, int hd, const float* inv_freq,
                 int rotary_dim, float attention_scaling, cudaStream_t stream);

// ---- gemm/ -----------------------------------------------------------------------

// Rows handled per GEMV pass: larger n runs in passes of this many rows.
constexpr int kGemvRowsPerPass = 8;

// out[i, j] = dot(x[i, :], dequant(w row j)) (+ bias[j]) for i < n, j < m, in
// fp32 with fp32 activations. w rows are row_bytes apart; k % 32 == 0 for the
// quantised dtypes. out has leading dimension m. bias may be null.
void launch_gemv(DType dtype, const void* w, int64_t row_bytes, int64_t m, int64_t k, const float* x, int64_t n,
                 const float* bias, float* out, cudaStream_t stream);

// dst[r, :] = dequant(w row r) as fp32, r < rows (dst leading dimension k).
void launch_dequant_rows(DType dtype, const void* w, int64_t row_bytes, int64_t rows, int64_t k, float* dst,
                         cudaStream_t stream);

// ---- attention/ ------------------------------------------------------------------

// Writes k, v [n, hk, hd] (fp32) into the pages at slot_mapping[t] (page *
// block_size + row, -1 skips; slots >= num_slots are skipped). Caches are
// [num_slots, hk, hd] of cache_dtype (F32, F16 or BF16).
void launch_kv_write(const float* k, const float* v, const int32_t* slot_mapping, int64_t n, int hk, int hd,
                     DType cache_dtype, void* k_cache, void* v_cache, int64_t num_slots, cudaStream_t stream);

struct PagedAttentionArgs {
  const float* q = nullptr;       // [num_tokens, hq, hd]
  const void* k_cache = nullptr;  // [num_blocks, block_size, hk, hd] of kv_dtype
  const void* v_cache = nullptr;
  DType kv_dtype = DType::kF32;
  int num_blocks = 0;
  int block_size = 0;
  int hq = 0, hk = 0, hd = 0;
  int num_seqs = 0, num_tokens = 0, max_q_len = 0, max_kv_len = 0;
  const int32_t* q_indptr = nullptr;       // [num_seqs + 1]
  const int32_t* kv_lens = nullptr;        // [num_seqs]
  const int32_t* block_indptr = nullptr;   // [num_seqs + 1]
  const int32_t* block_indices = nullptr;  // [block_indptr[num_seqs]]
  const int32_t* positions = nullptr;      // [num_tokens]
  float scale = 1.0f;
  int window = 0;        // 0: unlimited
  float* out = nullptr;  // [num_tokens, hq, hd]
  // Split along the KV sequence: num_splits > 1 needs partial buffers
  // part_acc [num_splits, num_tokens, hq, hd] and part_ml [num_splits, num_tokens, hq, 2].
  int num_splits = 1;
  float* part_acc = nullptr;
  float* part_ml = nullptr;
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

}  // namespace osprey::cuda
