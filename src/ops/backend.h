// The ops interface every backend implements. Model code (src/model) is
// written only against this; it never includes a backend header.
//
// Conventions: activations are F32 (CPU) unless stated; weights may be any
// DType including the block-quantised ones, kept packed. Shapes are given as
// comments; "n" is the number of tokens in the step.
#pragma once

#include <cstdint>
#include <memory>

#include "core/tensor.h"

namespace osprey::ops {

// Rotary embedding frequencies. inv_freq[i] for i in [0, rotary_dim/2) is
// computed once by make_rope_inv_freq (src/ops/rope_freq.h), including
// Llama 3.1 style scaling, so backends only rotate.
struct RopeTable {
  const float* inv_freq = nullptr;  // [rotary_dim / 2], host or device memory
  int rotary_dim = 0;               // == head_dim for every supported architecture
  float attention_scaling = 1.0f;   // multiplies cos/sin (1 except for YaRN-like scalings)
};

// Describes the sequences of one step for attention and KV writes. All arrays
// are I32 on the backend's device.
//
// Token t of the step belongs to sequence s when q_indptr[s] <= t < q_indptr[s+1].
// Its absolute position is positions[t]; it attends causally to KV positions
// [max(0, positions[t] - window + 1), positions[t]] of its sequence (window = 0
// means unlimited). The KV entry of position p of sequence s lives in page
// block_indices[block_indptr[s] + p / block_size], row p % block_size.
struct AttentionBatch {
  int num_seqs = 0;
  int num_tokens = 0;
  int max_kv_len = 0;      // max over sequences of kv_lens
  int max_q_len = 0;       // max over sequences of query tokens
  const int32_t* q_indptr = nullptr;       // [num_seqs + 1]
  const int32_t* kv_lens = nullptr;        // [num_seqs] tokens in KV after this step's writes
  const int32_t* block_indptr = nullptr;   // [num_seqs + 1]
  const int32_t* block_indices = nullptr;  // [block_indptr[num_seqs]]
  const int32_t* positions = nullptr;      // [num_tokens]
  const int32_t* slot_mapping = nullptr;   // [num_tokens] page * block_size + row, -1 = skip
};

// One layer's paged KV cache:
//   k, v: [num_blocks, block_size, num_kv_heads, head_dim], dtype F32 or F16/BF16.
struct LayerKv {
  Tensor k;
  Tensor v;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual const char* name() const = 0;

  // Memory for step buffers and the KV pool. Returned memory is zeroed.
  virtual void* alloc(size_t bytes) = 0;
  virtual void free(void* p) = 0;
  virtual void copy_to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  virtual void synchronize() = 0;

  // out[n, d] = dequant(table[ids[i], :]); table [vocab, d] any dtype; ids on device.
  virtual void embedding(const Tensor& table, const int32_t* ids, Tensor& out) = 0;

  // out[n, d] = x / rms(x) * w; w [d] F32.
  virtual void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& out) = 0;

  // residual[n, d] += x; out = rms_norm(residual) * w.
  virtual void add_rms_norm(Tensor& residual, const Tensor& x, const Tensor& w, float eps,
                            Tensor& out) = 0;

  // x[n, d] += y[n, d]
  virtual void add(Tensor& x, const Tensor& y) = 0;

  // out[n, m] = x[n, k] @ w[m, k]^T (+ bias[m]); w any dtype (packed), bias F32 or undefined.
  virtual void matmul(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& out) = 0;

  // Per-head RMSNorm (Qwen3 q/k norm): x [n, heads, head_dim] in place, w [head_dim].
  virtual void head_rms_norm(Tensor& x, const Tensor& w, float eps) = 0;

  // In place, Hugging Face half-rotation layout: for each head, pairs
  // (x[i], x[i + rotary_dim/2]). q [n, hq, hd], k [n, hk, hd].
  virtual void rope(Tensor& q, Tensor& k, const int32_t* positions, const RopeTable& table) = 0;

  // out[n, f] = silu(gate_up[n, :f]) * gate_up[n, f:]
  virtual void silu_mul(const Tensor& gate_up, Tensor& out) = 0;

  // Writes k, v [n, hk, hd] into the layer's pages at batch.slot_mapping.
  virtual void kv_write(const Tensor& k, const Tensor& v, const AttentionBatch& batch, LayerKv& kv) = 0;

  // out[n, hq, hd] = softmax(q k^T * scale) v over each token's causal window,
  // reading K/V from pages (GQA: query head h uses kv head h / (hq / hk)).
  virtual void paged_attention(const Tensor& q, const LayerKv& kv, const AttentionBatch& batch,
                               float scale, int sliding_window, Tensor& out) = 0;

  // out[r, :] = x[rows[r], :] for r in [0, num_rows); x [n, d].
  virtual void gather_rows(const Tensor& x, const int32_t* rows, int num_rows, Tensor& out) = 0;
};

std::unique_ptr<Backend> make_cpu_backend(int num_threads);
#ifdef OSPREY_HAVE_CUDA
// Null when the device cannot be opened (the reason goes to stderr).
std::unique_ptr<Backend> make_cuda_backend(int device_index);
#endif

}  // namespace osprey::ops
